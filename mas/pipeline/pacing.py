"""Writing only as far ahead as the GPUs need.

A planned video of a normal-priority batch waits (`waiting`) until fewer than MAS_WRITE_AHEAD videos are
written or being written and not yet rendered (`writing`, `rendering`), studio-wide; then it moves to
`writing` and its chain is sent. Each time a video leaves that set (its render is done, it fails or is
cancelled), the next waiting one is let through: the GPUs always have prompts ready, later prompts are
written after earlier gradings (the Writer learns within a batch), and a cancel or pause wastes few calls.
High-priority work (an A/B test a person waits for) is never held back.

`release` changes rows only; the caller sends the chains after its commit (a send lost between the two is
found by reconcile, which also calls `release`, like any unfinished video nothing carries).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from mas import locks, names
from mas.config import Settings
from mas.domain.steps import AHEAD_OF_THE_GPU, StepPayload
from mas.models import Batch, BatchStatus, Video, VideoState
from mas.names import Priority
from mas.outbox import eventlog

S = VideoState

Released = list[tuple[StepPayload, Priority]]


def first_state(priority: Priority) -> VideoState:
    """The state a newly planned video starts in: waiting for its turn, or writing at once (high priority)."""
    return S.writing if priority == "high" else S.waiting


def leaves_ahead(source: VideoState, target: VideoState) -> bool:
    """Whether a move frees a place ahead of the GPUs."""
    return source in AHEAD_OF_THE_GPU and target not in AHEAD_OF_THE_GPU


def release(settings: Settings, session: Session) -> Released:
    """Move waiting videos of running batches to writing while fewer than MAS_WRITE_AHEAD are ahead, oldest
    batch first; their first attempts' payloads, to send once the caller's transaction commits."""
    locks.acquire(session.connection(), names.WRITE_AHEAD_LOCK)  # two releases at once would overfill
    ahead = session.scalar(
        sa.select(sa.func.count())
        .select_from(Video)
        .join(Batch)
        .where(Video.state.in_(list(AHEAD_OF_THE_GPU)), Batch.status == BatchStatus.running, Batch.priority != "high")
    )
    room = settings.scheduling.write_ahead - (ahead or 0)
    if room <= 0:
        return []
    rows = session.execute(
        sa.select(Video.id, Batch.priority)
        .join(Batch)
        .where(Video.state == S.waiting, Batch.status == BatchStatus.running)
        .order_by(Batch.id, Video.position, Video.id)
        .limit(room)
        .with_for_update(of=Video, skip_locked=True)
    ).all()
    if not rows:
        return []
    session.execute(
        sa.update(Video)
        .where(Video.id.in_([video_id for video_id, _ in rows]), Video.state == S.waiting)
        .values(state=S.writing, updated_at=sa.func.now())
    )
    eventlog.moved_all(session, [video_id for video_id, _ in rows], S.waiting, S.writing)
    return [(StepPayload(video_id=video_id, attempt=1), priority) for video_id, priority in rows]
