"""What happens when a video reaches a final state, shared by the cpu and gpu steps.

The batch counters, series progress, batch completion and the interaction count move in the same
transaction as the video's own final transition, so they are exact however often a message is delivered.
"""

from __future__ import annotations

import logging

import redis
import sqlalchemy as sa
from kombu.exceptions import OperationalError as BrokerUnreachable
from sqlalchemy.dialects.postgresql import insert as pg_insert

from mas import events, names
from mas.db import rows_changed, session_scope
from mas.domain.states import TERMINAL
from mas.domain.steps import StepPayload
from mas.errors import PeerUnavailable
from mas.memory import blocks
from mas.models import (
    AgentBuffer,
    Attempt,
    Batch,
    BatchStatus,
    Series,
    Video,
    VideoState,
)
from mas.pipeline import pacing, states
from mas.pipeline.chains import send_released
from mas.pipeline.leases import LeaseHeld
from mas.redaction import redact_text

log = logging.getLogger(__name__)
S = VideoState
LOST_CONNECTION = (redis.ConnectionError, redis.TimeoutError, BrokerUnreachable)
"""A step that ends on one of these lost its connection to the broker (Redis restarting, a network cut): it is
not the video's fault. The video is left as it is; its lease ends, and reconcile sends the step again (a step
that keeps failing so is given up by its lease's claim count, with the reason). So is a step that kept finding
its lease held (`LeaseHeld`). A database that stays away past its waiting (`StudioTask.database_retries`, about
ten minutes) still fails the video with the reason."""


def pending_videos(session, batch_id: int) -> list[int]:
    """The next unfinished videos of a batch, as many as a core block comfortably holds."""
    return list(
        session.scalars(
            sa.select(Video.id)
            .where(Video.batch_id == batch_id, Video.state.not_in(list(TERMINAL)))
            .order_by(Video.position)
            .limit(blocks.PENDING_SHOWN)
        )
    )


def fail_on_error(task, exc, task_id, args, kwargs, einfo) -> None:
    """A step failed for good (its retries spent): skip the video with the reason, and the batch goes on; a
    lost connection is transient and fails nothing (`LOST_CONNECTION`)."""
    payload = StepPayload.of_message(args, kwargs)
    if payload is None:
        return  # a message that named no video: nothing to skip
    if isinstance(exc, LeaseHeld) or (isinstance(exc, LOST_CONNECTION) and not isinstance(exc, PeerUnavailable)):
        log.warning(
            "%s of video %s attempt %s ended on %s (%s); not the video's fault: reconcile sends it again",
            task.name,
            payload.video_id,
            payload.attempt,
            type(exc).__name__,
            exc,
        )
        return
    settings = task.app.settings
    step = getattr(task, "step", None)
    what = step.name if step is not None else task.name.rsplit(".", 1)[-1]
    reason = redact_text(f"{what} failed: {type(exc).__name__}: {exc}", settings.secret_values())[:400]
    due, released = False, []
    with session_scope(settings) as session:
        session.execute(
            sa.update(Attempt)
            .where(Attempt.video_id == payload.video_id, Attempt.number == payload.attempt)
            .values(
                failure_reasons=sa.func.coalesce(Attempt.failure_reasons, sa.text("'[]'::jsonb")).op("||")(
                    sa.func.jsonb_build_array(reason)
                )
            )
        )
        at = (step.state, payload.attempt) if step is not None else None
        if states.fail(session, payload.video_id, reason, at=at):
            due = finish_video(settings, session, payload.video_id)
            if step is not None and pacing.leaves_ahead(step.state, S.failed):  # its place is free
                released = pacing.release(settings, session)
    send_released(task.app, released)
    if due:
        task.app.send_task(names.CONSOLIDATE)


def fail_batch(settings, batch_id: int, reason: str) -> bool:
    """A batch whose planning failed for good ends `failed` with the reason; False if it was not queued."""
    reason = redact_text(reason, settings.secret_values())[:1000]
    with session_scope(settings) as session:
        changed = rows_changed(
            session,
            (
                sa.update(Batch)
                .where(Batch.id == batch_id, Batch.status == BatchStatus.queued)
                .values(status=BatchStatus.failed, failure_reason=reason, updated_at=sa.func.now())
            ),
        )
        if changed:
            batch = session.get_one(Batch, batch_id)
            events.record(session, settings, type="batch.failed", batch=batch, data={"reason": reason})
        return changed == 1


def fail_planning(task, exc, task_id, args, kwargs, einfo) -> None:
    """`on_failure` of planning: its retries are spent, or the error cannot pass by retrying."""
    batch_id = args[0] if args else kwargs.get("batch_id")
    fail_batch(task.app.settings, batch_id, f"planning failed: {type(exc).__name__}: {exc}")


def finish_video(settings, session, video_id: int) -> bool:
    """A video reached accepted or failed: batch counters, series progress, batch completion.

    Counts the interaction; True when a sleeptime consolidation is due (send it after the commit).
    """
    video = session.get(Video, video_id)
    session.refresh(video)
    batch = session.execute(sa.select(Batch).where(Batch.id == video.batch_id).with_for_update()).scalar_one()
    entry = {"video_id": video.id, "batch_id": batch.id, "grade": video.grade, "attempts": video.attempt_count}

    def queue(v):
        change = {"IN_PROGRESS": None if v["IN_PROGRESS"] == str(video.id) else v["IN_PROGRESS"]}
        if v["BATCH_ID"] == str(batch.id):
            change["BATCH_COMPLETE"] = v["BATCH_COMPLETE"] + 1
            change["PENDING_VIDEOS"] = pending_videos(session, batch.id)
        if video.state == S.accepted:
            change["COMPLETED_TODAY"] = (v["COMPLETED_TODAY"] + [entry])[-blocks.KEEP :]
        else:
            reasons = [r[:100] for r in video.failure_reasons[-2:]]
            change["FAILED_RETRIES"] = (v["FAILED_RETRIES"] + [{**entry, "reasons": reasons}])[-blocks.KEEP_FAILED :]
        return change

    blocks.update(settings, "production_queue", queue, actor="cameraman", session=session)
    if batch.series_id and video.state == S.accepted:
        series = session.execute(sa.select(Series).where(Series.id == batch.series_id).with_for_update()).scalar_one()
        series.episodes_completed += 1
        blocks.update(
            settings,
            "current_series",
            lambda v: {"EPISODES_COMPLETED": series.episodes_completed} if v["ACTIVE_SERIES"] == series.name else {},
            actor="cameraman",
            session=session,
        )
    events.record(
        session,
        settings,
        type="video.accepted" if video.state == S.accepted else "video.failed",
        batch=batch,
        data={
            "video_id": video.id,
            "concept": video.concept,
            "grade": video.grade,
            "attempts": video.attempt_count,
            "output": video.output_path,
            "failure_reasons": video.failure_reasons if video.state == S.failed else [],
        },
    )
    counts: dict[VideoState, int] = {
        state: count
        for state, count in session.execute(
            sa.select(Video.state, sa.func.count()).where(Video.batch_id == batch.id).group_by(Video.state)
        )
    }
    live = sum(count for state, count in counts.items() if state not in TERMINAL)
    if live == 0 and batch.status == BatchStatus.running:
        batch.status = BatchStatus.done
        batch.updated_at = sa.func.now()
        summary = {"total": batch.total, "accepted": counts.get(S.accepted, 0), "failed": counts.get(S.failed, 0)}
        events.record(session, settings, type="batch.done", batch=batch, data=summary)
        if batch.ab_test_id is not None:
            events.record(session, settings, type="ab.ready", batch=batch, data={"ab_test_id": batch.ab_test_id})
        blocks.update(
            settings,
            "production_queue",
            lambda v: {"QUEUE_STATUS": "complete"} if v["BATCH_ID"] == str(batch.id) else {},
            actor="director",
            session=session,
        )
        blocks.update(
            settings,
            "session_state",
            lambda v: {
                "PENDING_WORK": [w for w in v["PENDING_WORK"] if w.get("batch_id") != batch.id],
                "IN_PROGRESS_PROJECT": None,
                "QUEUED_VIDEOS": [],
                "LAST_ACTIVITY": blocks.now_iso(),
            },
            actor="director",
            session=session,
        )
    interactions = session.execute(
        pg_insert(AgentBuffer)
        .values(agent="director", summary="", failed_summaries=0, interactions=1)
        .on_conflict_do_update(index_elements=["agent"], set_={"interactions": AgentBuffer.interactions + 1})
        .returning(AgentBuffer.interactions)
    ).scalar_one()
    return interactions % settings.sleeptime_frequency == 0
