"""Putting a request into production: a Batch row first (Postgres is the truth), then a message.

If sending fails after the commit, the batch stays `queued` and the reconcile job re-sends it.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa

from mas.celery_app import app
from mas.db import session_scope
from mas.models import Batch, Schedule
from mas.requests import ProductionRequest

PLAN_TASK = "tasks.pipeline.plan_batch"


def new_batch(session, request: ProductionRequest) -> Batch:
    """A queued Batch row for `request`, flushed so it has its id."""
    batch = Batch(
        request=request.text, kind=request.kind, theme=request.theme, total=request.count,
        options={"series_name": request.series_name},
    )
    session.add(batch)
    session.flush()
    return batch


def submit(settings, request: ProductionRequest) -> int:
    """Store the request as a batch and send it to the Director; return the batch id."""
    with session_scope(settings) as session:
        batch_id = new_batch(session, request).id
    send_plan(batch_id)
    return batch_id


def schedule(settings, request: ProductionRequest, *, run_at: datetime) -> int:
    """Store the request to be enqueued at `run_at` (an overnight batch); return the schedule id."""
    with session_scope(settings) as session:
        row = Schedule(run_at=run_at, request=request.text, options={})
        session.add(row)
        session.flush()
        return row.id


def run_due_schedules(settings) -> list[int]:
    """Turn every due schedule into a batch, exactly once, and send the batches; return their ids.

    The batch is created in the same transaction that marks the schedule sent, and rows are claimed with
    SKIP LOCKED, so two beats or a restarted beat never run a schedule twice. A crash between the commit
    and the send leaves a queued batch, which the reconcile job sends.
    """
    from mas.requests import parse_request

    with session_scope(settings) as session:
        due = session.scalars(
            sa.select(Schedule)
            .where(Schedule.status == "scheduled", Schedule.run_at <= sa.func.now())
            .order_by(Schedule.run_at)
            .with_for_update(skip_locked=True)
        ).all()
        batch_ids = []
        for row in due:
            row.batch_id = new_batch(session, parse_request(row.request, settings)).id
            row.status = "sent"
            batch_ids.append(row.batch_id)
    for batch_id in batch_ids:
        send_plan(batch_id)
    return batch_ids


def cancel_schedule(settings, schedule_id: int) -> bool:
    """Cancel a schedule that has not run; False when there is no such pending schedule."""
    with session_scope(settings) as session:
        result = session.execute(
            sa.update(Schedule).where(Schedule.id == schedule_id, Schedule.status == "scheduled").values(status="cancelled")
        )
        return result.rowcount == 1


def schedules(settings) -> list[Schedule]:
    with session_scope(settings) as session:
        return list(session.scalars(sa.select(Schedule).order_by(Schedule.run_at.desc()).limit(100)))


def send_plan(batch_id: int) -> None:
    app.send_task(PLAN_TASK, args=[batch_id])


def batch_overview(settings, batch_id: int | None = None):
    """The batch (latest when no id) with its videos, or None."""
    from sqlalchemy.orm import selectinload

    with session_scope(settings) as session:
        stmt = sa.select(Batch).options(selectinload(Batch.videos))
        stmt = stmt.where(Batch.id == batch_id) if batch_id else stmt.order_by(Batch.id.desc()).limit(1)
        return session.scalars(stmt).first()
