"""Putting a request into production: a Batch row first (Postgres is the truth), then a message.

If sending fails after the commit, the batch stays `queued` and the reconcile job re-sends it.
"""

from __future__ import annotations

import sqlalchemy as sa

from mas.celery_app import app
from mas.db import session_scope
from mas.models import Batch
from mas.requests import ProductionRequest

PLAN_TASK = "tasks.pipeline.plan_batch"


def submit(settings, request: ProductionRequest, *, options: dict | None = None) -> int:
    """Store the request as a batch and send it to the Director; return the batch id."""
    with session_scope(settings) as session:
        batch = Batch(
            request=request.text,
            kind=request.kind,
            theme=request.theme,
            total=request.count,
            options={"series_name": request.series_name, **(options or {})},
        )
        session.add(batch)
        session.flush()
        batch_id = batch.id
    send_plan(batch_id)
    return batch_id


def send_plan(batch_id: int) -> None:
    app.send_task(PLAN_TASK, args=[batch_id])


def batch_overview(settings, batch_id: int | None = None):
    """The batch (latest when no id) with its videos, or None."""
    from sqlalchemy.orm import selectinload

    with session_scope(settings) as session:
        stmt = sa.select(Batch).options(selectinload(Batch.videos))
        stmt = stmt.where(Batch.id == batch_id) if batch_id else stmt.order_by(Batch.id.desc()).limit(1)
        return session.scalars(stmt).first()
