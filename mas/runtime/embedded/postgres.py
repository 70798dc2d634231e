"""The embedded PostgreSQL 16 + pgvector (pgserver), under the data folder.

Pitfalls handled here:

- as root pgserver runs PostgreSQL as a `pgserver` system user, so stopping it runs pg_ctl as the owner of
  the data folder;
- a killed `mas` process leaves the server running: it is found by postmaster.pid and reused, never
  started twice; a stale postmaster.pid is cleared before a fresh start, and a recorded pid that now
  belongs to some unrelated process is never taken for our server, nor signalled;
- a data folder deleted under a running server: `down` still finds it (by command line) and stops it;
- a first initdb that fails half-way is wiped, not left to fail every later start;
- pgserver caches one server object per data folder and process, and would hand back a stopped one after
  `down`; the cache is dropped before every start.
"""

from __future__ import annotations

import atexit
import logging
import os
import pwd
import shutil
import signal
import subprocess
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import psutil

from mas.config import Settings
from mas.runtime.embedded.common import (
    ServiceError,
    alive,
    first_line,
    locked,
    log_tail,
    same_path,
    send_signal,
    wait_gone,
)


def sqlalchemy_url(uri: str) -> str:
    return uri.replace("postgresql://", "postgresql+psycopg://", 1)


@dataclass(frozen=True)
class Postmaster:
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
        if not alive(proc) or not proc.name().startswith("postgres"):
            return False
        try:
            return same_path(proc.cwd(), pgdata)  # a postmaster's working folder is its data folder
        except psutil.AccessDenied:
            pass
        cmdline = proc.cmdline()
        if "-D" in cmdline and cmdline.index("-D") + 1 < len(cmdline):
            return same_path(cmdline[cmdline.index("-D") + 1], pgdata)
        return True  # a postgres we may not inspect: never take its pid file for stale
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


def postmaster(settings: Settings) -> Postmaster | None:
    """The running postmaster of this data folder, or None (no pid file, or a stale one)."""
    pid, lines = _read_postmaster_pid(settings)
    if pid is None:
        return None
    try:
        proc = psutil.Process(pid)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    return Postmaster(proc, lines) if _is_our_postmaster(proc, settings.pgdata) else None


def _orphan_postmaster(settings: Settings) -> psutil.Process | None:
    """A postmaster started on this data folder that its postmaster.pid no longer names (the file, or the
    whole folder, was deleted under it). PostgreSQL notices that only after a minute or so."""
    pgdata = str(settings.pgdata)
    for proc in psutil.process_iter(attrs=["name", "cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if (proc.info.get("name") or "").startswith("postgres") and "-D" in cmdline and alive(proc):
            at = cmdline.index("-D")
            if at + 1 < len(cmdline) and cmdline[at + 1] == pgdata:
                return proc
    return None


def _stop_postmaster(proc: psutil.Process, first: int) -> None:
    """Signal a postmaster: `first` (SIGINT: fast shutdown; SIGQUIT: immediate), then harder if it hangs."""
    send_signal(proc, first)
    if not wait_gone(proc, 30 if first == signal.SIGINT else 5):
        send_signal(proc, signal.SIGQUIT)
        if not wait_gone(proc, 5):
            send_signal(proc, signal.SIGKILL)
            wait_gone(proc, 5)


def _clear_stale_postmaster_pid(settings: Settings) -> None:
    """Remove a postmaster.pid whose process is gone or is not our postgres (call with no server running).

    PostgreSQL would refuse to start while the recorded pid is alive, even when it was recycled.
    """
    pidfile = _postmaster_pidfile(settings)
    if pidfile.exists() and postmaster(settings) is None:
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
    return log_tail(log)


def start_postgres(settings: Settings) -> str:
    """Start (or find running) the embedded PostgreSQL; return its SQLAlchemy URL."""
    settings.data_dir.resolve().mkdir(parents=True, exist_ok=True)
    with locked(settings):
        deadline = time.monotonic() + 60
        while (running := postmaster(settings)) is not None:
            if running.status == "ready":
                return sqlalchemy_url(running.get_uri())
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
                detail = _pg_failure(failures.messages, log) or first_line(exc)
                if fresh:  # an initdb that failed half-way (and could not clean up) would poison every retry
                    shutil.rmtree(settings.pgdata, ignore_errors=True)
                if attempt == 2 or os.geteuid() != 0:
                    see = f"; see {log}" if log.exists() else ""
                    raise ServiceError(f"embedded PostgreSQL did not start ({detail}){see}") from exc
            finally:
                pglog.removeHandler(failures)
        running = postmaster(settings)
        if running is None:
            raise ServiceError(f"embedded PostgreSQL did not start; see {settings.pgdata / 'log'}")
        return sqlalchemy_url(running.get_uri())


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
    with locked(settings):
        running = postmaster(settings)
        if running is None:
            orphan = _orphan_postmaster(settings)
            if orphan is not None:  # its data folder is gone (nothing to save) or it lost its pid file
                _stop_postmaster(orphan, signal.SIGINT if settings.pgdata.is_dir() else signal.SIGQUIT)
            _clear_stale_postmaster_pid(settings)
            return orphan is not None
        _import_pgserver()
        from pgserver._commands import POSTGRES_BIN_PATH

        try:  # noqa: SIM105
            subprocess.run(
                [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(settings.pgdata), "-w", "-t", "30", "-m", "fast", "stop"],
                check=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                user=_pgdata_owner(settings),
                timeout=40,
            )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError):
            pass  # the signals below finish the job
        if alive(running.process):
            _stop_postmaster(running.process, signal.SIGINT)  # SIGINT is what pg_ctl's "fast" mode sends
        return True
