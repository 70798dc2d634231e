"""The state machine of a video, with guarded transitions.

A transition is one conditional UPDATE: it succeeds only from the expected state *and* attempt number.
A task delivered twice therefore finds the video already moved on and does nothing (`moved` is False);
a move the machine does not allow raises `IllegalTransition` and changes nothing. Every move made is logged
(`video.state`, from and to) in its transaction (`mas.outbox.eventlog`).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from mas.domain.states import TERMINAL, BatchStatus, VideoState
from mas.domain.steps import ALLOWED
from mas.errors import PermanentError
from mas.models import Attempt, Batch, Video
from mas.outbox import eventlog

S = VideoState


class IllegalTransition(PermanentError, ValueError):
    """The state machine has no such move."""

    def __init__(self, source: VideoState, target: VideoState) -> None:
        super().__init__(f"a video cannot go from {source.value} to {target.value}")
        self.source, self.target = source, target


def transition(
    session: Session,
    video_id: int,
    source: VideoState,
    target: VideoState,
    *,
    attempt: int | None = None,
    **values: Any,
) -> bool:
    """Move a video from `source` to `target`; False (and nothing written) if it is not in `source`.

    `attempt`, when given, must match the video's current attempt count; `values` are written in the
    same UPDATE (for example a grade or an output path).
    """
    if target not in ALLOWED[source]:
        raise IllegalTransition(source, target)
    stmt = (
        sa.update(Video)
        .where(Video.id == video_id, Video.state == source)
        .values(state=target, updated_at=sa.func.now(), **values)
    )
    if attempt is not None:
        stmt = stmt.where(Video.attempt_count == attempt)
    moved = session.execute(stmt.returning(Video.batch_id, Video.attempt_count)).one_or_none()
    if moved is None:
        return False
    eventlog.moved(
        session, video_id, batch_id=moved.batch_id, source=source, target=target, attempt=moved.attempt_count
    )
    return True


def attempt_row(session: Session, video_id: int, number: int) -> Attempt:
    """Attempt `number` of a video (it exists once the Writer has written it)."""
    return session.execute(
        sa.select(Attempt).where(Attempt.video_id == video_id, Attempt.number == number)
    ).scalar_one()


def fail(session: Session, video_id: int, reason: str, *, at: tuple[VideoState, int] | None = None) -> bool:
    """Give a video up, recording why; False if it is already final. With `at` (a state and an attempt) only
    from there: a step that failed for good fails the video only if the video still waits for that step."""
    return _end(session, video_id, S.failed, reason, at=at)


def cancel(session: Session, video_id: int, reason: str) -> bool:
    """Cancel a video from whatever live state it is in, recording why; False if already final."""
    return _end(session, video_id, S.cancelled, reason)


def _end(
    session: Session, video_id: int, target: VideoState, reason: str, *, at: tuple[VideoState, int] | None = None
) -> bool:
    reasons = sa.func.coalesce(Video.failure_reasons, sa.text("'[]'::jsonb")).op("||")(
        sa.func.jsonb_build_array(reason)
    )
    stmt = (
        sa.update(Video)
        .where(Video.id == video_id, Video.state.not_in(list(TERMINAL)))
        .values(state=target, failure_reasons=reasons, updated_at=sa.func.now())
    )
    if at is not None:
        stmt = stmt.where(Video.state == at[0], Video.attempt_count == at[1])
    was = session.scalar(sa.select(Video.state).where(Video.id == video_id).with_for_update())
    moved = session.execute(stmt.returning(Video.batch_id, Video.attempt_count)).one_or_none()
    if moved is None or was is None:
        return False
    eventlog.moved(session, video_id, batch_id=moved.batch_id, source=was, target=target, attempt=moved.attempt_count)
    return True


def steps_may_run(session: Session, video_id: int) -> bool:
    """Whether a step of this video may start now: its batch is running (not paused, cancelled or over)."""
    status = session.scalar(sa.select(Batch.status).join(Video, Video.batch_id == Batch.id).where(Video.id == video_id))
    return status == BatchStatus.running


def cancelled(session: Session, video_id: int) -> bool:
    """Whether the video was cancelled (a running step polls this to stop early)."""
    return session.scalar(sa.select(Video.state).where(Video.id == video_id)) == S.cancelled
