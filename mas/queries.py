"""Read-only questions the command line and people ask of the studio: what is queued, running, done.

Each answer comes from where the truth lives: batches, videos and schedules from PostgreSQL, waiting gpu
work and model residency from Redis. Nothing here writes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import selectinload

from mas import names
from mas.celery_app import app, queue_keys
from mas.clients import redis_client
from mas.config import Settings
from mas.db import session_scope
from mas.memory import blocks
from mas.models import Batch, Schedule, Video


def batch_overview(settings: Settings, batch_id: int | None = None) -> Batch | None:
    """The batch (the latest when no id) with its videos in order, or None."""
    with session_scope(settings) as session:
        stmt = sa.select(Batch).options(selectinload(Batch.videos))
        stmt = stmt.where(Batch.id == batch_id) if batch_id else stmt.order_by(Batch.id.desc()).limit(1)
        return session.scalars(stmt).first()


def recent_videos(settings: Settings, *, batch: int | None = None, limit: int = 50) -> list[Video]:
    """The newest `limit` videos (of one batch, if given), oldest first."""
    stmt = sa.select(Video).order_by(Video.id.desc()).limit(limit)
    if batch is not None:
        stmt = stmt.where(Video.batch_id == batch)
    with session_scope(settings) as session:
        return list(reversed(session.scalars(stmt).all()))


def schedules(settings: Settings, *, limit: int = 100) -> list[Schedule]:
    """Scheduled, sent and cancelled batches, latest start first."""
    with session_scope(settings) as session:
        return list(session.scalars(sa.select(Schedule).order_by(Schedule.run_at.desc()).limit(limit)))


def pending_work(settings: Settings) -> list[dict[str, Any]]:
    """Work a previous session left unfinished (`session_state.PENDING_WORK`): batch ids and requests."""
    return blocks.read(settings, "session_state")["PENDING_WORK"]


@dataclass(frozen=True, kw_only=True)
class Residency:
    """Model residency on the gpu worker, as it last published it (after its latest gpu task)."""

    loads: int
    evictions: int
    swaps: int
    resident: list[str]


@dataclass(frozen=True, kw_only=True)
class GpuSummary:
    renders_waiting: int
    gradings_waiting: int
    residency: Residency | None  # None until a gpu worker has run a task


def gpu_summary(settings: Settings) -> GpuSummary:
    """GPU work waiting in the broker, and the gpu worker's model loads, evictions and swaps."""
    client = redis_client(settings)
    renders, gradings = (
        sum(client.llen(key) for key in queue_keys(app, queue)) for queue in (names.GPU_QUEUE, names.GRADE_QUEUE)
    )
    raw = client.get(names.GPU_STATS_KEY)
    residency = None
    if raw is not None:
        stats = json.loads(raw)
        residency = Residency(
            loads=stats["loads"], evictions=stats["evictions"], swaps=stats["swaps"], resident=list(stats["resident"])
        )
    return GpuSummary(renders_waiting=renders, gradings_waiting=gradings, residency=residency)
