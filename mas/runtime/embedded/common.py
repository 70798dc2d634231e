"""What the embedded PostgreSQL and Redis share: the start/stop lock of a data folder, process checks.

The embedded services run as background servers under the data folder, outlive the command that started
them (so every `mas` command and worker reuses them), and stop on `mas down`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

from mas.config import Settings
from mas.errors import RetryableError


class ServiceError(RetryableError):
    """A service could not be started, reached or stopped; the message says what to do."""


@contextlib.contextmanager
def locked(settings: Settings) -> Iterator[None]:
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


def alive(proc: psutil.Process) -> bool:
    """The process exists and is not a zombie (a zombie holds a pid, but nothing else)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


def wait_gone(proc: psutil.Process, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while alive(proc):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def send_signal(proc: psutil.Process, sig: int) -> None:
    with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess, ProcessLookupError):
        proc.send_signal(sig)


def same_path(a: str | os.PathLike, b: Path) -> bool:
    try:
        return Path(a).resolve() == b
    except OSError:
        return False


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def log_tail(path: Path, lines: int = 1) -> str:
    try:
        tail = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return " | ".join(tail[-lines:])
