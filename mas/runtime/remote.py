"""Work done now on a running worker, and waited for: recovery on a cpu worker, a regrade or a Tuner run
on the gpu worker (where the models live).

A worker that does not answer in time, or a task that fails there, comes back as one studio error whose
message says what happened and what to do.
"""

from __future__ import annotations

from typing import Any

from celery.exceptions import TimeoutError as ResultTimeout

from mas import names
from mas.config import Settings
from mas.domain.identity import Actor
from mas.errors import PeerUnavailable, PermanentError
from mas.runtime.app import app_for


class NoWorkerAnswered(PeerUnavailable, TimeoutError):
    """No worker took the task in time; it stays queued and runs when one starts."""


class TaskFailed(PermanentError):
    """The task ran on a worker and raised; the message carries the worker's error."""


def _run_on_worker(settings: Settings, task: str, *args: Any, kind: str, timeout: float) -> Any:
    result = app_for(settings).send_task(task, args=list(args))
    try:
        answer = result.get(timeout=timeout, propagate=False)
    except ResultTimeout:
        raise NoWorkerAnswered(
            f"no {kind} worker answered within {int(timeout)} s: start one with `mas run` "
            f"(or `mas worker --queue {kind}`); the request stays queued until one does"
        ) from None
    if result.failed():
        raise TaskFailed(f"{task} failed on the {kind} worker: {type(answer).__name__}: {answer}")
    return answer


def request_recover(settings: Settings, *, timeout: float = 120) -> dict:
    """Rebuild the queues from Postgres (safe any time); a cpu worker does it, as it sees what every worker
    holds. Returns the ids re-planned and re-sent."""
    return _run_on_worker(settings, names.RECOVER, kind="cpu", timeout=timeout)


def regrade(settings: Settings, video_id: int) -> dict:
    """Grade a video again with the configured grader; the per-axis report, nothing stored. It is urgent
    work: it waits at most for the task on the GPU now (MAS_MAX_RENDER_SECONDS), then runs for at most
    MAS_REGRADE_MAX_SECONDS."""
    timeout = settings.gpu.max_render_seconds + settings.gpu.regrade_max_seconds
    return _run_on_worker(settings, names.REGRADE, video_id, kind="gpu", timeout=timeout)


def tune(settings: Settings, actor: Actor, *, dry_run: bool = False) -> dict:
    """Run the Tuner now for `actor`; its report (pairs, the pairwise taste and the DPO adapter:
    training, held-out accuracy, promotion and why). It waits for its GPU turn behind the work already in
    the worker, then trains for at most MAS_TUNE_MAX_SECONDS."""
    timeout = (1 + settings.gpu.lookahead) * settings.gpu.max_render_seconds + settings.gpu.tune_max_seconds
    return _run_on_worker(settings, names.TUNE, dry_run, actor.user, kind="gpu", timeout=timeout)["reports"][0]
