"""Finishing work the broker lost: reconcile, recover and stuck detection.

Postgres says which videos are unfinished; the broker and the workers say which of them some message or
running task still carries ("live"). An unfinished video that is not live and has made no progress for a
while lost its message (a wiped broker, a worker killed with SIGKILL whose unacked message Redis would only
hand back after the visibility timeout): it is re-sent from the step its state names. Re-sending is safe
because every step is guarded by state and attempt number: a duplicate does nothing.
"""

from __future__ import annotations

import base64
import json
import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import sqlalchemy as sa

from mas import names, states
from mas.celery_app import app, queue_keys
from mas.clients import redis_client
from mas.config import Settings
from mas.db import session_scope
from mas.models import Batch, BatchStatus, Video
from mas.outcomes import finish_video
from tasks.pipeline import next_step, video_chain

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class Live:
    """What the broker and the workers still carry."""

    videos: set[int] = field(default_factory=set)
    batches: set[int] = field(default_factory=set)
    queued_videos: set[int] = field(default_factory=set)  # waiting in a queue, not yet taken

    def add(self, name: str, args: list, *, queued: bool) -> None:
        if not args:
            return
        first = args[0]
        if name in (names.PLAN_BATCH, names.RESUME_BATCH):
            self.batches.add(int(first))
            return
        video_id = first.get("video_id") if isinstance(first, dict) else first
        if isinstance(video_id, int):
            self.videos.add(video_id)
            if queued:
                self.queued_videos.add(video_id)


def live_work(settings: Settings, *, inspect_timeout: float = 2.0) -> Live:
    """Videos and batches that a queued message or a task on a worker (running or reserved) carries."""
    live = Live()
    client = redis_client(settings)
    for queue in app.conf.task_queues:
        for key in queue_keys(app, queue.name):
            for raw in client.lrange(key, 0, -1):
                name, args = _decode(raw)
                live.add(name, args, queued=True)
    inspect = app.control.inspect(timeout=inspect_timeout)
    for listing in (inspect.active() or {}, inspect.reserved() or {}):
        for tasks in listing.values():
            for task in tasks:
                live.add(task.get("name", ""), task.get("args") or [], queued=False)
    return live


def _decode(raw: bytes) -> tuple[str, list]:
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
    resent: list[int]
    skipped: list[int]


def reconcile(settings: Settings, *, older_than: float, stuck_after: float | None = None) -> Report:
    """Re-send what Postgres says is unfinished and nothing carries; skip what is stuck.

    `older_than`: seconds without progress before a video (or a queued batch) counts as lost; 0 re-sends
    everything not live (`mas recover` after the broker lost its data). `stuck_after`: seconds without
    progress after which a video that is not waiting in a queue is skipped and recorded as stuck.
    """
    live = live_work(settings)
    now = datetime.now(timezone.utc)
    lost_before = now - timedelta(seconds=older_than)
    replanned, resend, skipped = [], [], []
    with session_scope(settings) as session:
        queued = session.scalars(
            sa.select(Batch.id).where(Batch.status == BatchStatus.queued, Batch.created_at <= lost_before)
        ).all()
        replanned = [b for b in queued if b not in live.batches]
        unfinished = session.scalars(
            sa.select(Video).join(Batch).where(
                Video.state.not_in(list(states.TERMINAL)), Batch.status == BatchStatus.running
            )
        ).all()
        for video in unfinished:
            idle = (now - video.updated_at).total_seconds()
            if stuck_after is not None and idle >= stuck_after and video.id not in live.queued_videos:
                skipped.append(video.id)
            elif video.updated_at <= lost_before and video.id not in live.videos:
                resend.append((video.id, *next_step(video)))
    for video_id in skipped:
        with session_scope(settings) as session:
            if states.fail(session, video_id, f"stuck: no progress for over {int(stuck_after)} s"):
                finish_video(settings, session, video_id)
    for batch_id in replanned:
        app.send_task(names.PLAN_BATCH, args=[batch_id])
    for video_id, start, attempt in resend:
        video_chain(video_id, attempt, start=start).apply_async()
    if replanned or resend or skipped:
        log.warning("reconcile: replanned batches %s, re-sent videos %s, skipped stuck videos %s",
                    replanned, [v for v, _, _ in resend], skipped)
    return Report(replanned=replanned, resent=[v for v, _, _ in resend], skipped=skipped)
