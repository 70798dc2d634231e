"""The embedded services on real servers: start, reuse, restart, stop, crash leftovers, and the CLI.

Every test has a fresh data folder of its own and stops whatever it started; the `data` fixture also kills
(and reports) anything still running from that folder after `down`, so a failing test leaks nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import redis
import sqlalchemy as sa
from click.testing import CliRunner

from mas.cli import main
from mas.config import Settings
from mas.runtime import services

ROOT = Path(__file__).resolve().parents[2]
UNREACHABLE_DB = "postgresql://nobody@127.0.0.1:1/nodb"


def make_settings(data_dir: Path) -> Settings:
    """Embedded services under `data_dir`, whatever MAS_* URLs the environment running the tests sets."""
    return Settings(data_dir=data_dir, database_url=None, broker_url=None, result_backend=None)


def processes_of(settings: Settings) -> list[psutil.Process]:
    """Every process that belongs to this data folder: it names the pgdata or the Redis socket on its
    command line, or it works in the data folder (PostgreSQL and Redis chdir there)."""
    data_dir = settings.data_dir.resolve()
    marks = (str(settings.pgdata), str(settings.redis_socket))
    found = []
    for proc in psutil.process_iter(attrs=["cmdline", "cwd", "status"]):
        if proc.pid == os.getpid() or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        cmdline = " ".join(proc.info["cmdline"] or [])
        cwd = proc.info["cwd"] or ""
        if any(m in cmdline for m in marks) or cwd == str(data_dir) or cwd.startswith(f"{data_dir}/"):
            found.append(proc)
    return found


def describe_procs(procs: list[psutil.Process]) -> list[str]:
    return [f"{p.pid} {p.info['cmdline'][0][:120] if p.info['cmdline'] else ''} (in {p.info['cwd']})" for p in procs]


def kill_all(procs: list[psutil.Process]) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(procs, timeout=10)


@pytest.fixture
def fresh_dir(tmp_path, monkeypatch):
    """A new, empty folder of this test's own, removed afterwards.

    Not under pytest's tmp_path: as root PostgreSQL runs as the `pgserver` user, which must traverse every
    folder above its data, and every pytest session that starts (another engineer's, say) closes
    /tmp/pytest-of-USER to its owner again, failing an initdb or pg_ctl running at that moment.
    """
    monkeypatch.chdir(tmp_path)  # no stray .env is read
    folder = Path(tempfile.mkdtemp(prefix="mas-svc-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def data(fresh_dir):
    """Settings for a fresh data folder; everything started there is stopped afterwards."""
    settings = make_settings(fresh_dir / "data")
    try:
        yield settings
    finally:
        services.down(settings)
        leaked = processes_of(settings)
        kill_all(leaked)
        assert not leaked, f"still running after down: {describe_procs(leaked)}"


def sql(settings: Settings, statement: str, **params):
    engine = sa.create_engine(services.database_url(settings, start=False))
    try:
        with engine.begin() as conn:
            result = conn.execute(sa.text(statement), params)
            return result.all() if result.returns_rows else None
    finally:
        engine.dispose()


def redis_of(settings: Settings) -> redis.Redis:
    return redis.Redis(unix_socket_path=str(settings.redis_socket), socket_timeout=5)


def described(settings: Settings) -> dict[str, services.ServiceInfo]:
    return {info.name: info for info in services.describe(settings)}


def postmasters(settings: Settings) -> list[psutil.Process]:
    """Postmaster processes of this pgdata (its children are retitled and carry no -D)."""
    return [
        p for p in processes_of(settings)
        if p.name() == "postgres" and str(settings.pgdata) in p.cmdline() and "-D" in p.cmdline()
    ]


def redis_servers(settings: Settings) -> list[psutil.Process]:
    return [p for p in processes_of(settings) if p.name().startswith("redis")]


# --- 1. fresh data folder -------------------------------------------------------------------------


def test_up_on_a_fresh_data_dir_starts_both(data):
    assert not data.data_dir.exists()
    before = described(data)
    assert not before["postgres"].running and not before["redis"].running
    assert before["postgres"].mode == before["redis"].mode == "embedded"

    services.up(data)

    assert sql(data, "select 1") == [(1,)]
    sql(data, "create extension if not exists vector")
    assert sql(data, "select '[1,2,3]'::vector <-> '[1,2,5]'::vector") == [(2.0,)]
    assert redis_of(data).ping() is True

    info = described(data)
    assert info["postgres"].running and info["redis"].running
    assert info["postgres"].pid == postmasters(data)[0].pid
    assert info["redis"].pid == redis_servers(data)[0].pid
    assert info["redis"].url == data.effective_broker_url
    assert (data.data_dir / "redis" / "appendonly.aof").exists()  # append-only, as promised

    services.up(data)  # a second `up` reuses both
    again = described(data)
    assert (again["postgres"].pid, again["redis"].pid) == (info["postgres"].pid, info["redis"].pid)
    assert len(postmasters(data)) == 1 and len(redis_servers(data)) == 1


def test_long_data_dir_uses_short_sockets(fresh_dir):
    """Unix socket paths are limited to ~107 bytes: both servers must still start under a deep folder."""
    deep = fresh_dir / ("d" * 60) / ("e" * 60)
    settings = make_settings(deep)
    assert len(str(settings.pgdata / ".s.PGSQL.5432")) > 108
    try:
        services.up(settings)
        assert len(str(settings.redis_socket)) < 100
        assert sql(settings, "select 1") == [(1,)]
        assert redis_of(settings).ping()
        assert all(info.running for info in services.describe(settings))
        assert services.down(settings) == ["redis", "postgres"]
        assert not settings.redis_socket.parent.exists()  # the short socket's folder is not left behind
    finally:
        services.down(settings)
        leaked = processes_of(settings)
        kill_all(leaked)
        assert not leaked, f"still running after down: {describe_procs(leaked)}"


# --- 2. restart keeps the data --------------------------------------------------------------------


def test_data_survives_down_and_up(data):
    services.up(data)
    sql(data, "create table kept (id int primary key, note text)")
    sql(data, "insert into kept values (1, 'still here')")
    redis_of(data).set("kept", "still here")
    first = described(data)

    assert services.down(data) == ["redis", "postgres"]
    stopped = described(data)
    assert not stopped["postgres"].running and not stopped["redis"].running

    services.up(data)  # same process: pgserver's cached handle must not fool us into "already running"
    second = described(data)
    assert second["postgres"].running and second["redis"].running
    assert second["postgres"].pid != first["postgres"].pid and second["redis"].pid != first["redis"].pid
    assert sql(data, "select note from kept where id = 1") == [("still here",)]
    assert redis_of(data).get("kept") == b"still here"


# --- 3. down stops everything ---------------------------------------------------------------------


def test_down_leaves_nothing_running(data):
    services.up(data)
    started = processes_of(data)
    assert postmasters(data) and redis_servers(data) and len(started) > 2  # postmaster + its helpers

    assert services.down(data) == ["redis", "postgres"]

    assert processes_of(data) == []
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in started)
    assert not data.redis_socket.exists()
    assert not (data.pgdata / "postmaster.pid").exists()
    assert services.down(data) == []  # a second down is a harmless no-op
    info = described(data)
    assert not info["postgres"].running and info["postgres"].pid is None
    assert not info["redis"].running and info["redis"].pid is None


def test_down_on_a_data_dir_never_used_creates_nothing(fresh_dir):
    settings = make_settings(fresh_dir / "never")
    assert services.down(settings) == []
    assert not settings.data_dir.exists()


def test_down_after_the_data_dir_was_deleted(data):
    """`rm -rf` of the data folder under running servers: `down` still stops them, quickly, writing nothing;
    a later `up` starts afresh."""
    services.up(data)
    before = described(data)
    shutil.rmtree(data.data_dir)

    started = time.monotonic()
    assert sorted(services.down(data)) == ["postgres", "redis"]
    assert time.monotonic() - started < 15
    assert processes_of(data) == []
    assert not data.data_dir.exists()

    services.up(data)
    after = described(data)
    assert after["postgres"].running and after["redis"].running
    assert after["postgres"].pid != before["postgres"].pid and after["redis"].pid != before["redis"].pid
    assert sql(data, "select 1") == [(1,)]


def test_down_when_redis_cannot_write_its_final_snapshot(data):
    """SHUTDOWN SAVE fails (a full disk, here a folder in the snapshot's way) and Redis would refuse to exit,
    even on SIGTERM: `down` still stops it promptly, and the append-only file keeps the data."""
    services.up(data)
    redis_of(data).set("kept", "yes")
    blocker = data.data_dir / "redis" / "dump.rdb"
    blocker.mkdir()
    started = time.monotonic()
    assert services.down(data) == ["redis", "postgres"]
    assert time.monotonic() - started < 10
    assert redis_servers(data) == []
    blocker.rmdir()
    services.up(data)
    assert redis_of(data).get("kept") == b"yes"


# --- 4. crash leftovers ---------------------------------------------------------------------------

CHILD = """
import json, sys, time
from pathlib import Path
from mas.runtime import services
from mas.runtime.clients import redis_client
from mas.config import Settings
s = Settings(data_dir=Path(sys.argv[1]), database_url=None, broker_url=None, result_backend=None)
services.up(s)
redis_client(s).set("from-child", "1")
print(json.dumps({i.name: i.pid for i in services.describe(s)}), flush=True)
time.sleep(600)
"""


def _read_line(proc: subprocess.Popen, timeout: float) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise TimeoutError("the child did not report in time")
    return proc.stdout.readline()


def test_servers_outlive_a_killed_mas_and_are_reused(data):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAS_")}
    env["PYTHONPATH"] = str(ROOT)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(data.data_dir)], cwd=ROOT, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )
    try:
        line = _read_line(child, timeout=120)
    finally:
        child.send_signal(signal.SIGKILL)  # no atexit, no cleanup: what a `kill -9` or OOM does
        child.wait(10)
    pids = json.loads(line)

    assert psutil.pid_exists(pids["postgres"]) and psutil.pid_exists(pids["redis"])
    services.up(data)
    info = described(data)
    assert (info["postgres"].pid, info["redis"].pid) == (pids["postgres"], pids["redis"])
    assert len(postmasters(data)) == 1 and len(redis_servers(data)) == 1  # no duplicates
    assert redis_of(data).get("from-child") == b"1"

    # Redis dies hard: its socket and pid file stay behind, and the pid file may name a recycled pid
    killed = psutil.Process(pids["redis"])
    killed.kill()
    psutil.wait_procs([killed], timeout=10)
    assert data.redis_socket.exists()
    assert not described(data)["redis"].running
    unrelated = subprocess.Popen(["sleep", "60"])
    try:
        (data.data_dir / "redis" / "redis.pid").write_text(f"{unrelated.pid}\n")
        assert described(data)["redis"].pid is None  # a stranger is not our Redis
        services.up(data)
        fresh = described(data)
        assert fresh["redis"].running and fresh["redis"].pid not in (pids["redis"], unrelated.pid)
        assert redis_of(data).get("from-child") == b"1"  # the append-only file had it
        assert len(redis_servers(data)) == 1
        assert unrelated.poll() is None  # and nobody shot the stranger
    finally:
        unrelated.kill()
        unrelated.wait()


def test_stale_postmaster_pid_is_cleared(data):
    services.up(data)
    sql(data, "create table kept (id int)")
    sql(data, "insert into kept values (7)")
    pidfile = data.pgdata / "postmaster.pid"
    lines = pidfile.read_text().splitlines()
    assert services.stop_postgres(data) and not pidfile.exists()

    # 1. the recorded pid is dead (the machine or the postmaster was killed)
    gone = subprocess.Popen(["true"])
    gone.wait()
    pidfile.write_text("\n".join([str(gone.pid), *lines[1:]]) + "\n")
    assert not described(data)["postgres"].running
    services.up(data)
    assert described(data)["postgres"].running
    assert sql(data, "select id from kept") == [(7,)]
    assert services.stop_postgres(data)

    # 2. the recorded pid was recycled by an unrelated live process: neither reused nor signalled
    unrelated = subprocess.Popen(["sleep", "60"])
    try:
        pidfile.write_text("\n".join([str(unrelated.pid), *lines[1:]]) + "\n")
        assert not described(data)["postgres"].running
        assert services.stop_postgres(data) is False
        services.up(data)
        info = described(data)
        assert info["postgres"].running and info["postgres"].pid != unrelated.pid
        assert sql(data, "select id from kept") == [(7,)]
        assert services.down(data) == ["redis", "postgres"]
        assert unrelated.poll() is None
    finally:
        unrelated.kill()
        unrelated.wait()

    # 3. a truncated pid file (crash while it was written)
    pidfile.write_text("")
    services.up(data)
    assert sql(data, "select id from kept") == [(7,)]


CONCURRENT = """
import json, sys, time
from pathlib import Path
from mas.runtime import services
from mas.config import Settings
s = Settings(data_dir=Path(sys.argv[1]), database_url=None, broker_url=None, result_backend=None)
print("ready", flush=True)
while not Path(sys.argv[2]).exists():
    time.sleep(0.001)
services.start_redis(s)  # Redis first: PostgreSQL's start is serialized by pgserver's own lock anyway
services.up(s)
print(json.dumps({i.name: i.pid for i in services.describe(s)}), flush=True)
"""


def test_concurrent_ups_start_one_of_each(data):
    """A cpu and a gpu worker started together must share one PostgreSQL and one Redis."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAS_")}
    env["PYTHONPATH"] = str(ROOT)
    go = data.data_dir.parent / "go"  # the starting signal
    children = [
        subprocess.Popen([sys.executable, "-c", CONCURRENT, str(data.data_dir), str(go)], cwd=ROOT, env=env,
                         text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(3)
    ]
    reports = []
    try:
        for child in children:
            assert _read_line(child, timeout=60).strip() == "ready"
        go.touch()  # all at once
        for child in children:
            out, err = child.communicate(timeout=120)
            assert child.returncode == 0, err[-2000:]
            reports.append(json.loads(out))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    assert len({(r["postgres"], r["redis"]) for r in reports}) == 1
    assert len(postmasters(data)) == 1 and len(redis_servers(data)) == 1


# --- 5. the command line --------------------------------------------------------------------------


def cli(data_dir: Path, *args: str, **env: str | None):
    runner = CliRunner(
        env={"MAS_DATA_DIR": str(data_dir), "MAS_DATABASE_URL": None, "MAS_BROKER_URL": None,
             "MAS_RESULT_BACKEND": None, "COLUMNS": "250", **env}
    )
    return runner.invoke(main, list(args))


def one_line_error(result) -> str:
    assert result.exit_code != 0, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)  # no crash
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    return lines[0]


def test_cli_up_services_down(data):
    result = cli(data.data_dir, "up")
    assert result.exit_code == 0, result.output
    assert "postgres" in result.output and "redis" in result.output and "service" in result.output
    pids = {info.pid for info in services.describe(data)}
    assert all(str(pid) in result.output for pid in pids)

    result = cli(data.data_dir, "services")
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if line.startswith(("│ postgres ", "│ redis "))]
    assert len(rows) == 2 and all("embedded" in row and "yes" in row for row in rows)  # a long path wraps below

    result = cli(data.data_dir, "down")
    assert result.exit_code == 0, result.output
    assert "stopped: redis, postgres" in result.output
    assert processes_of(data) == []

    result = cli(data.data_dir, "down")
    assert result.exit_code == 0 and "nothing embedded was running" in result.output


def test_cli_refuses_a_database_url_of_another_kind(data):
    line = one_line_error(cli(data.data_dir, "up", MAS_DATABASE_URL="mysql://x"))
    assert "invalid MAS_DATABASE_URL" in line
    assert not data.data_dir.exists()


def test_cli_up_with_an_unreachable_database(data):
    started = time.monotonic()
    line = one_line_error(cli(data.data_dir, "up", MAS_DATABASE_URL=UNREACHABLE_DB))
    assert "cannot reach PostgreSQL" in line and "127.0.0.1" in line
    assert time.monotonic() - started < 15
    assert not data.data_dir.exists()  # nothing started: not even the embedded broker


@pytest.mark.parametrize("request_text", ["", "   ", "Create 2 videos of dragons"])
def test_cli_enqueue_writes_nothing_when_refused(data, request_text):
    line = one_line_error(cli(data.data_dir, "enqueue", request_text, MAS_DATABASE_URL=UNREACHABLE_DB))
    if request_text.strip():
        assert "cannot reach PostgreSQL" in line
    else:
        assert "empty" in line
    assert not data.data_dir.exists()  # no broker started, nothing queued
