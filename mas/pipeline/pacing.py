"""Writing only as far ahead as the GPUs need.

A planned video of a normal-priority batch waits (`waiting`) until fewer than MAS_WRITE_AHEAD videos are
written or being written and not yet rendered (`writing`, `rendering`), studio-wide; then it moves to
`writing` and its chain is sent. Each time a video leaves that set (its render is done, it fails or is
cancelled), the next waiting one is let through, shared between users by their GPU share (weighted fair
queuing: a user whose video waits is let through next, whatever others have queued). The GPUs always have
prompts ready, later prompts are written after earlier gradings (the Writer learns within a batch), and a cancel or pause wastes few calls.
High-priority work (an A/B test a person waits for) is never held back.

`release` changes rows only; the caller sends the chains after its commit (a send lost between the two is
found by reconcile, which also calls `release`, like any unfinished video nothing carries).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from mas import locks, names
from mas.config import Settings
from mas.domain.fair_share import Passes, take_turns
from mas.domain.steps import AHEAD_OF_THE_GPU, StepPayload
from mas.models import Batch, BatchStatus, FairPass, User, Video, VideoState
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
    """Move waiting videos of running batches to writing while fewer than MAS_WRITE_AHEAD are ahead, shared
    fairly between users by their GPU share (`mas.domain.fair_share`), each user's oldest batch first; their
    first attempts' payloads, to send once the caller's transaction commits."""
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
    waiting = _waiting_by_user(session, room)
    if not waiting:
        return []
    passes = _passes(session, list(waiting))
    shares = dict(session.execute(sa.select(User.name, User.gpu_share).where(User.name.in_(list(waiting)))).all())
    taken = take_turns(waiting, shares=shares, passes=passes, room=room)
    _keep(session, passes)
    session.execute(
        sa.update(Video)
        .where(Video.id.in_([video_id for video_id, _ in taken]), Video.state == S.waiting)
        .values(state=S.writing, updated_at=sa.func.now())
    )
    eventlog.moved_all(session, [video_id for video_id, _ in taken], S.waiting, S.writing)
    return [(StepPayload(video_id=video_id, attempt=1), priority) for video_id, priority in taken]


def waiting_order(session: Session) -> list[int]:
    """Every waiting video of a running batch, in the order `release` would let them through if nothing
    changed meanwhile (nothing is locked or written: what `mas status` and the API show as a place in line)."""
    waiting = _waiting_by_user(session, None)
    if not waiting:
        return []
    passes = _passes(session, list(waiting))
    shares = dict(session.execute(sa.select(User.name, User.gpu_share).where(User.name.in_(list(waiting)))).all())
    room = sum(len(videos) for videos in waiting.values())
    return [video_id for video_id, _ in take_turns(waiting, shares=shares, passes=passes, room=room)]


def _waiting_by_user(session: Session, room: int | None) -> dict[str, list[tuple[int, Priority]]]:
    """Each user's first `room` waiting videos (oldest batch first), locked when a room is given (every
    one, unlocked, when not); users with the oldest work first."""
    turn = sa.func.row_number().over(partition_by=Batch.user_name, order_by=(Batch.id, Video.position, Video.id))
    ranked = (
        sa.select(Video.id, Batch.priority, Batch.user_name, Batch.id.label("batch_id"), turn.label("turn"))
        .join(Batch)
        .where(Video.state == S.waiting, Batch.status == BatchStatus.running)
        .subquery()
    )
    stmt = sa.select(ranked.c.id, ranked.c.priority, ranked.c.user_name).order_by(ranked.c.batch_id, ranked.c.turn)
    rows = session.execute(stmt if room is None else stmt.where(ranked.c.turn <= room)).all()
    if room is None:
        unlocked: dict[str, list[tuple[int, Priority]]] = {}
        for video_id, priority, user in rows:
            unlocked.setdefault(user, []).append((video_id, priority))
        return unlocked
    locked = set(
        session.scalars(
            sa.select(Video.id)
            .where(Video.id.in_([row.id for row in rows]), Video.state == S.waiting)
            .with_for_update(skip_locked=True)
        )
    )
    waiting: dict[str, list[tuple[int, Priority]]] = {}
    for video_id, priority, user in rows:
        if video_id in locked:
            waiting.setdefault(user, []).append((video_id, priority))
    return waiting


VIRTUAL_TIME = ""
"""The row of `fair_passes` that keeps the virtual time (no user's name is empty)."""


def _passes(session: Session, users: list[str]) -> Passes:
    rows = dict(
        session.execute(
            sa.select(FairPass.user_name, FairPass.pass_value).where(FairPass.user_name.in_([*users, VIRTUAL_TIME]))
        ).all()
    )
    virtual = rows.pop(VIRTUAL_TIME, 0.0)
    return Passes(by_user=rows, virtual=virtual)


def _keep(session: Session, passes: Passes) -> None:
    values = [{"user_name": user, "pass_value": value} for user, value in passes.by_user.items()]
    values.append({"user_name": VIRTUAL_TIME, "pass_value": passes.virtual})
    upsert = pg_insert(FairPass).values(values)
    session.execute(
        upsert.on_conflict_do_update(index_elements=["user_name"], set_={"pass_value": upsert.excluded.pass_value})
    )
