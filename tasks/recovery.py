"""Finishing work the broker lost: reconcile and recover.

Postgres says which videos are unfinished; the broker, the workers and the step leases say which of them
something still carries ("live"). An unfinished video that nothing carries lost its message (a wiped
broker, a worker killed with SIGKILL whose unacked message Redis would only hand back after the visibility
timeout): it is re-sent from the step its state names. A long render or a video waiting in a queue is
never taken for lost: its lease's heartbeat, or its message, says it is alive. Re-sending is safe because
every step is guarded by its lease and by state and attempt number: a duplicate does nothing.
"""

from __future__ import annotations

import base64
import json
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from mas import names
from mas.config import Settings
from mas.db import session_scope
from mas.domain.steps import BY_TASK, STEP_STATES, StepPayload
from mas.models import Batch, BatchStatus, Video
from mas.names import Priority
from mas.pipeline import leases, pacing, rows
from mas.pipeline.chains import send_released, video_chain
from mas.pipeline.production import batch_priority, send_plan
from mas.pipeline.runner import resume_point
from mas.runtime.app import Studio, app_for, queue_keys
from mas.runtime.clients import redis_client

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class Live:
    """What the broker and the workers still carry, and which workers answered."""

    videos: set[int] = field(default_factory=set)
    batches: set[int] = field(default_factory=set)
    workers: set[str] = field(default_factory=set)

    def add(self, name: str, args: list, *, running: bool = False) -> None:
        if not args:
            return
        if name in (names.PLAN_BATCH, names.RESUME_BATCH):
            self.batches.add(int(args[0]))
        elif name in BY_TASK and not running and (payload := StepPayload.of_message(args, {})) is not None:
            self.videos.add(payload.video_id)


def live_work(settings: Settings, *, inspect_timeout: float = 1.0) -> Live:
    """Videos and batches that a task on a worker (waiting there, or a plan running) or a queued message
    carries.

    A running step is carried by its lease, not by the worker's list of active tasks: a task whose result
    could not be published (the broker away at that moment) can stay listed as active for ever, while
    its lease says whether it still runs. Workers are asked first, the queues read after: a task that
    finishes meanwhile has already queued its chain's next message, so work moving from a worker to a
    queue is seen in one place or the other.
    """
    live = Live()
    app = app_for(settings)
    inspect = app.control.inspect(timeout=inspect_timeout)
    for listing, running in ((inspect.active() or {}, True), (inspect.reserved() or {}, False)):
        live.workers.update(listing)
        for tasks in listing.values():
            for task in tasks:
                live.add(task.get("name", ""), task.get("args") or [], running=running)
    client = redis_client(settings)
    for queue in app.conf.task_queues:
        for key in queue_keys(app, queue.name):
            for raw in client.lrange(key, 0, -1):
                name, args = _decode(raw)
                live.add(name, args)
    return live


Lost = tuple[list[tuple[int, Priority]], list[int], set[int]]


def _lost(settings: Settings, lost_before: datetime, *, unanswered: bool = False) -> Lost:
    """Queued batches (id, priority) and unfinished videos of running batches (ids) that nothing carries now,
    and the videos whose steps were taken over. `unanswered`: first end the leases of workers that did not
    answer (`mas recover`). Ids and flags only: a row that cannot be read fails its own re-send, not this."""
    live = live_work(settings)
    taken_over = leases.expire_unanswered(settings, live.workers) if unanswered else set()
    alive, dead, last_step = leases.running(settings), leases.dead(settings), leases.last_activity(settings)
    with session_scope(settings) as session:
        queued = session.execute(
            sa.select(Batch.id, Batch.priority).where(
                Batch.status == BatchStatus.queued, Batch.created_at <= lost_before
            )
        ).all()
        unfinished = session.execute(
            sa.select(Video.id, Video.updated_at <= lost_before)
            .join(Batch)
            .where(Video.state.in_(list(STEP_STATES)), Batch.status == BatchStatus.running)
        ).all()
    resend = [
        video_id
        for video_id, still in unfinished
        if video_id not in live.videos
        and video_id not in alive
        and (video_id in dead or (still and last_step.get(video_id, lost_before) <= lost_before))
    ]
    replan = [(batch_id, priority) for batch_id, priority in queued if batch_id not in live.batches]
    return replan, resend, taken_over


REPLAN_JOB, RESEND_JOB = "replan", "resend"
"""Reconcile's jobs in `mas.pipeline.rows`: a batch or a video that cannot be sent again is marked, then parked."""


def _resend(settings: Settings, app: Studio, video_id: int) -> None:
    """Send a lost video's chain again from the step its state names."""
    with session_scope(settings) as session:
        video = session.get_one(Video, video_id)
        step, payload = resume_point(video)
        priority = batch_priority(video.batch)
    video_chain(app, payload, start=step, priority=priority).apply_async()


def _decode(raw: bytes | str) -> tuple[str, list]:
    """Task name and positional args of a Celery message as kombu stores it in a Redis list."""
    try:
        message = json.loads(raw)
        body = json.loads(base64.b64decode(message["body"]))
        return message["headers"]["task"], body[0]
    except (ValueError, KeyError, TypeError, IndexError):
        return "", []


@dataclass(frozen=True, kw_only=True)
class Report:
    replanned: list[int]
    resent: list[int]  # lost work sent again
    released: list[int]  # waiting videos whose write became due
    taken_over: list[int]  # videos whose running step's worker did not answer (`mas recover`)
    running: list[str]  # steps left to the live workers running them, as "video 3: render on gpu@a"


def reconcile(settings: Settings, *, older_than: float, unanswered: bool = False) -> Report:
    """Re-send what Postgres says is unfinished and nothing carries.

    A video is carried when a queued message or a worker holds it, or a step of it has a live lease (its
    heartbeat goes on, however long the step takes). It is lost when nothing carries it and either a step
    of it had a lease whose heartbeat stopped (its worker died), or neither its state nor a step of it moved
    for `older_than` seconds (0: at once, for `mas recover` after the broker lost its data). Only running
    batches are looked at: a paused, cancelled, failed or finished batch is left alone, and only queued
    batches are re-planned. With `unanswered` (`mas recover`), a step whose worker does not answer and whose
    heartbeat missed a beat is lost now, not when its lease expires.
    """
    lost_before = datetime.now(UTC) - timedelta(seconds=older_than)
    replanned, resend, taken_over = _lost(settings, lost_before, unanswered=unanswered)
    if replanned or resend:  # work in transit between a worker and a queue looks lost for a moment: look again
        again_batches, again_videos, _ = _lost(settings, lost_before)
        replanned = [b for b in replanned if b in again_batches]
        resend = [r for r in resend if r in again_videos]
    app = app_for(settings)
    priorities = dict(replanned)
    # one at a time: a batch or a video that cannot be sent is marked and skipped, never stopping the others
    replanned_ids = list(
        rows.each(settings, REPLAN_JOB, priorities, lambda b: send_plan(settings, b, priority=priorities[b])).done
    )
    resent_ids = list(rows.each(settings, RESEND_JOB, resend, lambda video_id: _resend(settings, app, video_id)).done)
    with session_scope(settings) as session:  # places ahead of the GPUs that nothing took (a lost send)
        released = pacing.release(settings, session)
    send_released(app, released)
    released_ids = [payload.video_id for payload, _ in released]
    if replanned_ids or resent_ids:
        log.warning("reconcile: replanned batches %s, re-sent videos %s", replanned_ids, resent_ids)
    if released:
        log.info("reconcile: let waiting videos %s through", released_ids)
    ended = leases.end_dead_of_final(settings)
    if ended:
        log.info("reconcile: ended the dead leases of final videos %s", sorted(ended))
    running = [f"video {h.video_id}: {h.step} on {h.worker}" for h in leases.holdings(settings) if h.beating]
    return Report(
        replanned=replanned_ids,
        resent=resent_ids,
        released=released_ids,
        taken_over=sorted(taken_over),
        running=running,
    )
