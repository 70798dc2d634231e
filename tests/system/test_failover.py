"""The studio rides through a failover of its database and of its broker, on real servers (127.0.0.1, TCP).

- PostgreSQL: a primary and a streaming standby (pgserver's binaries: pg_basebackup -R, pg_ctl promote), named
  together in one libpq multi-host MAS_DATABASE_URL. The primary is killed (SIGKILL): a write meanwhile raises
  the studio's retryable `DatabaseAway`; after the standby's promotion the same process's sessions write to it.
  A write that reaches a standby (read-only, SQLSTATE 25006) is retryable too, and empties the pool.
- Redis: a master and a replica watched by three Sentinels, all password protected. The master is killed: once
  the Sentinels name the replica as master, the studio's Redis client and a real cpu worker (sent a task through
  the app `mas.runtime.app` makes for the sentinel:// broker and result backend) go on working.

Time is compressed by the servers' own settings (Sentinel's down-after-milliseconds), never by sleeping: every
wait polls the servers for the event, with a deadline.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import sqlalchemy as sa

from mas import db, names
from mas.api import health
from mas.api.health import Readiness
from mas.config import Settings
from mas.errors import RetryableError
from mas.models import Batch
from mas.runtime import services
from mas.runtime.app import DATABASE_AWAY, app_for
from mas.runtime.clients import redis_client, redis_master
from mas.runtime.failover import DatabaseAway, is_away
from tests.harness.postgres_servers import PostgresServer, PostgresStandby, failover_url
from tests.harness.processes import postgres_available, redis_server_available, wait_for
from tests.harness.redis_servers import RedisSentinels
from tests.studio import ROOT, CeleryWorker, quiet

pytestmark = pytest.mark.skipif(
    bool(postgres_available() or redis_server_available()),
    reason=str(postgres_available() or redis_server_available()),
)


def _settings(data_dir: Path, **env: str) -> Settings:
    """Settings as a studio process with this environment reads them (nothing else from the test's own), and its
    database found as such a process finds it when it starts."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MAS_")}
    with mock.patch.dict(os.environ, {**clean, "MAS_DATA_DIR": str(data_dir), **env}, clear=True):
        settings = Settings()
    db.find(settings)
    return settings


def _write_batch(settings: Settings, request: str) -> int:
    with db.session_scope(settings) as session:
        batch = Batch(request=request, total=1)
        session.add(batch)
        session.flush()
        return batch.id


def _requests(settings: Settings) -> list[str]:
    with db.session_scope(settings) as session:
        return list(session.scalars(sa.select(Batch.request).order_by(Batch.id)))


@pytest.fixture
def pair(tmp_path):
    with PostgresServer(tmp_path / "primary") as primary, PostgresStandby(tmp_path / "standby", primary) as standby:
        yield primary, standby


def test_a_studio_session_fails_over_to_the_promoted_standby(pair, tmp_path):
    primary, standby = pair
    settings = _settings(tmp_path / "data", MAS_DATABASE_URL=failover_url(primary, standby))
    _write_batch(settings, "before the failover")
    assert db.primary(settings) == f"127.0.0.1:{primary.port}"
    [postgres, _] = services.describe(settings)
    assert postgres.running and postgres.primary == f"127.0.0.1:{primary.port}"
    assert primary.password not in postgres.url and f"127.0.0.1:{standby.port}" in postgres.url
    standby.caught_up()  # asynchronous replication: what the primary acknowledged has reached the standby

    primary.kill()
    with pytest.raises(DatabaseAway) as during:  # the primary is gone and the standby takes no writes yet
        _write_batch(settings, "during the outage")
    assert isinstance(during.value, RetryableError) and isinstance(during.value, DATABASE_AWAY)
    assert is_away(during.value)

    standby.promote()
    _write_batch(settings, "after the failover")  # the same process, engine and settings: no restart
    assert db.primary(settings) == f"127.0.0.1:{standby.port}"
    assert services.describe(settings)[0].primary == f"127.0.0.1:{standby.port}"
    readiness = Readiness(settings, {"postgres": health._postgres}, primaries=health.PRIMARIES)
    assert readiness.latest().checks == {"postgres": health.OK}
    assert readiness.latest().primaries == {"postgres": f"127.0.0.1:{standby.port}"}  # /readyz names it
    assert _requests(settings) == ["before the failover", "after the failover"]


def test_a_write_on_a_standby_is_retryable_and_empties_the_pool(pair, tmp_path):
    primary, standby = pair
    _write_batch(_settings(tmp_path / "data", MAS_DATABASE_URL=primary.url), "migrated on the primary")
    standby.caught_up()
    # the standby alone, as a connection left on a demoted primary (or a URL without target_session_attrs) sees it
    settings = _settings(tmp_path / "data", MAS_DATABASE_URL=standby.url)
    engine = db.ready_engine(settings)
    with engine.connect() as first, engine.connect() as second:  # two connections, both back in the pool after
        pids = {first.scalar(sa.text("select pg_backend_pid()")), second.scalar(sa.text("select pg_backend_pid()"))}

    with pytest.raises(DatabaseAway) as refused:
        _write_batch(settings, "on a standby")
    assert "read-only transaction" in str(refused.value) and isinstance(refused.value, RetryableError)
    assert refused.value.connection_invalidated

    with engine.connect() as first, engine.connect() as second:  # every connection made before was dropped
        after = {first.scalar(sa.text("select pg_backend_pid()")), second.scalar(sa.text("select pg_backend_pid()"))}
    assert not pids & after, "a connection made before the read-only error was used again"
    assert _requests(settings) == ["migrated on the primary"]  # reads still work there


# --- Redis Sentinel -------------------------------------------------------------------------------------------


@pytest.fixture
def sentinels(tmp_path):
    with RedisSentinels(tmp_path / "redis") as watched:
        yield watched


@pytest.fixture
def database(tmp_path):
    with PostgresServer(tmp_path / "postgres") as server:
        yield server


def test_the_redis_client_and_a_worker_ride_through_a_sentinel_failover(sentinels, database, tmp_path):
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MAS_")},
        "MAS_DATA_DIR": str(tmp_path / "data"),
        "MAS_DATABASE_URL": database.url,
        "PYTHONPATH": str(ROOT),
        **sentinels.env(),
    }
    settings = _settings(tmp_path / "data", **{k: v for k, v in env.items() if k.startswith("MAS_")})
    db.ready_engine(settings)
    client = redis_client(settings)
    client.set("before", "kept")
    old = sentinels.master_address()
    assert old is not None and redis_master(settings) == f"{old[0]}:{old[1]}"
    assert services.describe(settings)[1].primary == f"{old[0]}:{old[1]}"

    worker = CeleryWorker(kind="cpu", name="cpu@failover", env=env, log_dir=tmp_path)
    try:
        worker.wait_ready()
        app = app_for(settings)
        assert app.send_task(names.PING, kwargs={"tag": "before"}).get(timeout=60)["tag"] == "before"
        wait_for(lambda: quiet(settings), timeout=30, what="the worker to acknowledge its task")
        sentinels.replicated()  # what was written so far is on the replica too

        sentinels.server_at(old).kill()
        new = sentinels.wait_for_failover(old)
        assert new != old

        assert client.get("before") == b"kept"  # the same client: it asked the Sentinels again
        client.set("after", "written")
        assert sentinels.server_at(new).client().get("after") == b"written"
        assert redis_master(settings) == f"{new[0]}:{new[1]}"
        assert services.describe(settings)[1].primary == f"{new[0]}:{new[1]}"
        readiness = Readiness(settings, {"redis": health._redis}, primaries=health.PRIMARIES)
        assert readiness.latest().primaries == {"redis": f"{new[0]}:{new[1]}"}  # /readyz names it
        shown = subprocess.run(
            [sys.executable, "-m", "mas.cli", "services"], env={**env, "COLUMNS": "300"}, cwd=ROOT,
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert "primary now" in shown.stdout and f"{new[0]}:{new[1]}" in shown.stdout, shown.stdout + shown.stderr
        assert sentinels.password not in shown.stdout
        answer = app.send_task(names.PING, kwargs={"tag": "after"}).get(timeout=90)  # broker and results: new master
        assert answer == {"queue": names.CPU_QUEUE, "worker": "cpu@failover", "tag": "after"}
        assert worker.proc.poll() is None, worker.log.read_text()[-3000:]
    finally:
        worker.stop()
