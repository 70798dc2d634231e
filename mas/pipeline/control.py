"""Stopping and holding work: cancel a batch or one video, pause a batch, let it continue.

Postgres is changed first, in one transaction, so that no step, retry, reconcile or resume brings cancelled
work back: every step checks its video and its batch before it starts, and a running render polls its
video and stops itself (the worker process and its loaded models stay). Pausing stops new steps from
starting; the steps already running finish. Continuing re-sends each unfinished video from its next step.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from mas import names
from mas.config import Settings
from mas.db import session_scope
from mas.domain.identity import Actor
from mas.domain.states import TERMINAL
from mas.domain.steps import STARTS
from mas.errors import PermanentError
from mas.memory import blocks
from mas.models import Batch, BatchStatus, Video, VideoState
from mas.outbox import eventlog, events
from mas.pipeline import ending, pacing
from mas.pipeline.chains import send_released
from mas.runtime.app import app_for

S = VideoState
CANCELLED = "cancelled by the user"
OVER = (BatchStatus.done, BatchStatus.failed, BatchStatus.cancelled)


class NotChangeable(PermanentError):
    """The batch or video does not exist, or is in no state for this change; nothing was changed."""


def cancel_batch(settings: Settings, batch_id: int) -> list[int]:
    """Cancel a batch and every unfinished video of it; the ids of the videos cancelled."""
    with session_scope(settings) as session:
        # the videos before their batch, in id order, as a step ending a video locks them: the other order
        # deadlocks with a worker ending one of them
        live = session.scalars(
            sa.select(Video.id)
            .where(Video.batch_id == batch_id, Video.state.not_in(list(TERMINAL)))
            .order_by(Video.id)
            .with_for_update()
        ).all()
        batch = _batch(session, batch_id)
        if batch.status in OVER:
            raise NotChangeable(f"batch {batch_id} is already {batch.status.value}; nothing changed")
        batch.status = BatchStatus.cancelled
        batch.updated_at = sa.func.now()
        endings = {video_id: ending.give_up(settings, session, video_id, S.cancelled, CANCELLED) for video_id in live}
        cancelled = [video_id for video_id, ended in endings.items() if ended is not None]
        events.record(session, settings, type="batch.cancelled", batch=batch, data={"videos_cancelled": cancelled})
        blocks.update(
            settings,
            Actor(batch.user_name),
            "production_queue",
            lambda v: (
                {
                    "QUEUE_STATUS": "complete",
                    "IN_PROGRESS": None,
                    "PENDING_VIDEOS": [],
                }
                if v["BATCH_ID"] == str(batch_id)
                else {}
            ),
            by="cli",
            session=session,
        )
        blocks.update(
            settings,
            Actor(batch.user_name),
            "session_state",
            lambda v: {
                "PENDING_WORK": [w for w in v["PENDING_WORK"] if w.get("batch_id") != batch_id],
            },
            by="cli",
            session=session,
        )
    app = app_for(settings)
    for ended in endings.values():
        if ended is not None:
            ended.run(app)  # its places ahead of the GPUs go to other batches
    return cancelled


def cancel_video(settings: Settings, video_id: int) -> None:
    """Cancel one video; its batch goes on (and is done when this was its last unfinished video)."""
    with session_scope(settings) as session:
        video = session.execute(sa.select(Video).where(Video.id == video_id).with_for_update()).scalar_one_or_none()
        if video is None:
            raise NotChangeable(f"there is no video {video_id}; nothing changed")
        ended = ending.give_up(settings, session, video_id, S.cancelled, CANCELLED)
        if ended is None:
            raise NotChangeable(f"video {video_id} is already {video.state.value}; nothing changed")
    ended.run(app_for(settings))


def pause_batch(settings: Settings, batch_id: int) -> None:
    """Stop new steps of a queued or running batch from starting (running ones finish)."""
    with session_scope(settings) as session:
        batch = _batch(session, batch_id)
        if batch.status not in (BatchStatus.queued, BatchStatus.running):
            raise NotChangeable(f"batch {batch_id} is {batch.status.value}, not queued or running; nothing changed")
        batch.status = BatchStatus.paused
        batch.updated_at = sa.func.now()
        eventlog.batch_changed(session, "batch.paused", batch)
        _queue_status(settings, session, batch, "paused")
        released = pacing.release(settings, session)  # a paused batch holds no place ahead of the GPUs
    send_released(app_for(settings), released)


def continue_batch(settings: Settings, batch_id: int) -> None:
    """Let a paused batch go on: planned again if it never was, else every unfinished video re-sent."""
    with session_scope(settings) as session:
        batch = _batch(session, batch_id)
        if batch.status != BatchStatus.paused:
            raise NotChangeable(f"batch {batch_id} is {batch.status.value}, not paused; nothing changed")
        planned = session.scalar(sa.select(sa.func.count()).select_from(Video).where(Video.batch_id == batch_id))
        batch.status = BatchStatus.running if planned else BatchStatus.queued
        batch.updated_at = sa.func.now()
        eventlog.batch_changed(session, "batch.continued", batch)
        _queue_status(settings, session, batch, "active")
    app_for(settings).send_task(names.RESUME_BATCH, args=[batch_id], priority=STARTS)


def _queue_status(settings: Settings, session: Session, batch: Batch, status: str) -> None:
    """`production_queue.QUEUE_STATUS`, when the block is about this batch."""
    blocks.update(
        settings,
        Actor(batch.user_name),
        "production_queue",
        lambda v: {"QUEUE_STATUS": status} if v["BATCH_ID"] == str(batch.id) else {},
        by="cli",
        session=session,
    )


def _batch(session: Session, batch_id: int) -> Batch:
    batch: Batch | None = session.execute(
        sa.select(Batch).where(Batch.id == batch_id).with_for_update()
    ).scalar_one_or_none()
    if batch is None:
        raise NotChangeable(f"there is no batch {batch_id}; nothing changed")
    return batch
