"""The command lines of the studio's long-running processes: a cpu or gpu worker, beat, Flower.

One place for their flags, so `mas worker`, `mas beat`, `mas flower` and `mas run` start the same
processes. Each is Celery run by this interpreter (`python -m celery`), so it sees the same packages.
"""

from __future__ import annotations

import sys

from mas import names
from mas.config import Settings, is_loopback
from mas.errors import InvalidSettings


def _celery(*args: str) -> list[str]:
    return [sys.executable, "-m", "celery", *args]


def worker_argv(
    settings: Settings, kind: str, *, concurrency: int | None = None, loglevel: str = "INFO", name: str | None = None
) -> list[str]:
    """A worker of `kind` ("cpu" or "gpu"); every worker fetches one message per slot and acknowledges it late.

    A cpu worker runs `concurrency` processes. A gpu worker is one process (its models load once, on its
    device) running 1 + MAS_GPU_LOOKAHEAD tasks in threads: one holds the GPU, the others are ready to
    follow it (`gpu.turns`; with ComfyUI their prompts wait in ComfyUI's queue). Its default name carries
    its device, so two gpu workers on one host (one per GPU) have different names. Events stay on (`-E`:
    Flower, `mas recover`'s questions go by the control channel, not gossip).
    """
    if kind == "gpu":
        pool = ["-P", "threads", "-c", str(1 + settings.gpu.lookahead)]
        default_name = f"gpu-{settings.gpu.device.replace(':', '')}@%h" if settings.gpu.device else "gpu@%h"
    else:
        pool = ["-P", "prefork", "-c", str(concurrency or settings.scheduling.cpu_concurrency)]
        default_name = f"{kind}@%h"
    return _celery(
        "-A",
        "mas",
        "worker",
        "-Q",
        ",".join(names.WORKER_QUEUES[kind]),
        *pool,
        "--prefetch-multiplier",
        "1",
        "-n",
        name or default_name,
        "-l",
        loglevel,
        "-E",
        # Workers do not talk to each other: nothing here elects a leader or revokes tasks, so gossip (which
        # logged a traceback on every worker at a broker failover) and mingle (a start-up sync) are off.
        "--without-gossip",
        "--without-mingle",
    )


def beat_argv(settings: Settings, *, loglevel: str = "INFO") -> list[str]:
    """Beat with the table of `beat_schedule.py`, its state file in the data folder."""
    schedule_file = settings.data_dir.resolve() / "celerybeat-schedule"
    return _celery("-A", "beat_schedule:app", "beat", "-l", loglevel, "-s", str(schedule_file))


def flower_argv(settings: Settings, *, address: str, port: int) -> list[str]:
    """Flower on `address`; beyond loopback only with basic auth (MAS_FLOWER_USER, MAS_FLOWER_PASSWORD)."""
    auth = None
    if settings.service.flower_user and settings.service.flower_password:
        auth = f"{settings.service.flower_user}:{settings.service.flower_password.get_secret_value()}"
    if auth is None and not is_loopback(address):
        raise InvalidSettings(
            f"refusing to serve Flower on {address} without auth: set MAS_FLOWER_USER and MAS_FLOWER_PASSWORD"
        )
    argv = _celery("-A", "mas", "flower", f"--address={address}", f"--port={port}")
    return [*argv, f"--basic-auth={auth}"] if auth else argv
