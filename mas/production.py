"""Putting a request into production: a Batch row first (Postgres is the truth), then a message.

If sending fails after the commit, the batch stays `queued` and the reconcile job re-sends it.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa

from mas import names
from mas.celery_app import app
from mas.db import session_scope
from mas.models import Batch, Schedule
from mas.requests import ProductionRequest, parse_request


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


def send_plan(batch_id: int) -> None:
    """Ask the Director to plan a stored batch (a cpu worker picks it up)."""
    app.send_task(names.PLAN_BATCH, args=[batch_id])


def resume(batch_ids: list[int]) -> None:
    """Restart batches a previous session left pending: each goes on from what Postgres says is done."""
    for batch_id in batch_ids:
        app.send_task(names.RESUME_BATCH, args=[batch_id])
