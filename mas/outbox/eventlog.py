"""The studio's event log: what happened, one row per event, in the order the changes committed (`studio_events`);
the API's event streams follow it (`mas.api.stream`).

What is logged: every move of a video from one state to another (`video.state`, with `from`, `to` and the
attempt, wherever the move is made: `mas.pipeline.states`, pacing's release), the final events the webhooks report
(`mas.outbox.events.record` writes the log's row and the webhooks' rows, so both come from one place:
video.accepted / failed / cancelled, batch.done / failed / cancelled, ab.ready), and a batch created, planned,
paused and continued. An event is written in the transaction of the change it reports: both commit or neither.
Render progress is not logged (it is a picture of now, `mas.outbox.progress`).

Why ids commit in order
-----------------------
A reader follows the log by id: "the events after 41". Ids come from a sequence when a row is inserted, and two
transactions may commit in the opposite order of their ids: A takes 41, B takes 42 and commits, a reader serves
42, and when A commits 41 the reader is past it for good. So an event is not inserted when it is recorded:
`record` keeps it on the session, and just before the transaction commits (SQLAlchemy's `before_commit`) the
session is flushed, takes a transaction-level advisory lock (`names.EVENT_LOG_LOCK`), inserts its events and
commits, which releases the lock. One transaction at a time takes ids and commits them, and PostgreSQL makes a
commit visible before it releases the committer's locks: the next writer's ids are larger and become visible
later. Every reader therefore sees a prefix of the ids (with the gaps of rolled-back transactions), and
`id > last` never skips an event that commits later. The lock covers one INSERT and the commit, and its holder
waits for nothing else (its row locks were taken before it asked), so it cannot deadlock; commits that write
events are serialized, which is hundreds a second, far beyond what a studio writes.

Events recorded inside a savepoint that rolls back go with it; a transaction that rolls back writes none.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event as orm_event
from sqlalchemy.orm import Session, SessionTransaction

from mas import locks, names
from mas.config import Settings
from mas.db import rows_changed, session_scope
from mas.domain.states import BatchStatus, VideoState
from mas.models import Batch, StudioEvent, Video

PENDING = "mas.eventlog.pending"
"""Where a session keeps the events recorded in its transaction until it commits (`Session.info`)."""

PAGE = 500
"""The most events one read returns (a stream far behind catches up in pages)."""

VIDEO_STATE = "video.state"


@dataclass(frozen=True)
class _Pending:
    transaction: SessionTransaction
    type: str
    batch_id: int | None
    user_name: str | None
    data: dict[str, Any]


@dataclass(frozen=True)
class Logged:
    """An event as a reader gets it: its id (its place in the log), its type, and the body a client is sent,
    shaped as the webhooks' (`{"type", "timestamp", "data"}`)."""

    id: int
    type: str
    batch_id: int | None
    body: dict[str, Any]


# --- writing ----------------------------------------------------------------------------------------------


def record(
    session: Session, type: str, *, batch_id: int | None, data: dict[str, Any], user_name: str | None = None
) -> None:
    """Log an event with the session's transaction: inserted just before it commits, dropped if it rolls back.
    `user_name` (whose stream carries it) is the batch's owner when not given."""
    pending = session.info.get(PENDING)
    if pending is None:
        pending = session.info[PENDING] = []
        orm_event.listen(session, "before_commit", _write)
        orm_event.listen(session, "after_soft_rollback", _drop)
    transaction = session.get_nested_transaction() or session.get_transaction()
    assert transaction is not None  # the caller's change is in one
    pending.append(_Pending(transaction, type, batch_id, user_name, data))


def moved(
    session: Session, video_id: int, *, batch_id: int, source: VideoState, target: VideoState, attempt: int
) -> None:
    """Log a video's move from `source` to `target` (made in this transaction)."""
    data = {"batch_id": batch_id, "video_id": video_id, "from": source.value, "to": target.value, "attempt": attempt}
    record(session, VIDEO_STATE, batch_id=batch_id, data=data)


def moved_all(session: Session, video_ids: list[int], source: VideoState, target: VideoState) -> None:
    """Log the move of each of `video_ids` from `source` to `target` (made together in this transaction)."""
    rows = session.execute(
        sa.select(Video.id, Video.batch_id, Video.attempt_count).where(Video.id.in_(video_ids)).order_by(Video.id)
    ).all()
    for video_id, batch_id, attempt in rows:
        moved(session, video_id, batch_id=batch_id, source=source, target=target, attempt=attempt)


def batch_changed(session: Session, type: str, batch: Batch, **data: Any) -> None:
    """Log a change of a batch (created, planned, paused, continued), with its status after the change."""
    status = BatchStatus(batch.status).value if batch.status is not None else BatchStatus.queued.value
    record(
        session,
        type,
        batch_id=batch.id,
        user_name=batch.user_name,
        data={"batch_id": batch.id, "status": status, **data},
    )


def _write(session: Session) -> None:
    """`before_commit`: the transaction's events, inserted under the lock that keeps the log's ids in commit
    order (see the module's docstring)."""
    if session.get_nested_transaction() is not None:
        return  # a savepoint is released: its events wait for the transaction's commit
    pending: list[_Pending] = session.info.get(PENDING) or []
    if not pending:
        return
    session.flush()  # every row lock the transaction needs is taken before the event lock is asked for
    unknown = {p.batch_id for p in pending if p.user_name is None and p.batch_id is not None}
    owners = (
        dict(session.execute(sa.select(Batch.id, Batch.user_name).where(Batch.id.in_(unknown))).all())
        if unknown
        else {}
    )
    rows = [
        {
            "type": p.type,
            "batch_id": p.batch_id,
            "user_name": p.user_name if p.user_name is not None else owners.get(p.batch_id or 0, ""),  # "": an admin's
            "payload": p.data,
        }
        for p in pending
    ]
    session.info[PENDING] = []
    locks.acquire(session.connection(), names.EVENT_LOG_LOCK)  # released by the commit that follows
    session.execute(sa.insert(StudioEvent), rows)


def _drop(session: Session, previous_transaction: SessionTransaction) -> None:
    """`after_soft_rollback`: the events recorded in the transaction (or savepoint) rolled back go with it."""
    pending: list[_Pending] | None = session.info.get(PENDING)
    if pending:
        session.info[PENDING] = [p for p in pending if not _within(p.transaction, previous_transaction)]


def _within(transaction: SessionTransaction | None, outer: SessionTransaction) -> bool:
    while transaction is not None:
        if transaction is outer:
            return True
        transaction = transaction.parent
    return False


# --- reading ----------------------------------------------------------------------------------------------


def read_after(
    settings: Settings, last: int, *, user: str | None = None, batch_id: int | None = None, limit: int = PAGE
) -> list[Logged]:
    """The events after id `last`, oldest first: every user's, or `user`'s, or one batch's."""
    stmt = sa.select(StudioEvent).where(StudioEvent.id > last).order_by(StudioEvent.id).limit(limit)
    if user is not None:
        stmt = stmt.where(StudioEvent.user_name == user)
    if batch_id is not None:
        stmt = stmt.where(StudioEvent.batch_id == batch_id)
    with session_scope(settings) as session:
        return [
            Logged(
                id=row.id,
                type=row.type,
                batch_id=row.batch_id,
                body={"type": row.type, "timestamp": row.created_at.isoformat(), "data": row.payload},
            )
            for row in session.scalars(stmt)
        ]


def newest(session: Session) -> int:
    """The id of the newest event (0 when the log is empty): a reader starting now reads after it."""
    return session.scalar(sa.select(sa.func.coalesce(sa.func.max(StudioEvent.id), 0))) or 0


def delete_expired(settings: Settings) -> int:
    """Delete the events older than MAS_EVENT_RETENTION_DAYS; how many."""
    age = timedelta(days=settings.service.event_retention_days)
    with session_scope(settings) as session:
        return rows_changed(session, sa.delete(StudioEvent).where(StudioEvent.created_at < sa.func.now() - age))
