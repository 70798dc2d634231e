"""`/metrics`: the studio's figures in Prometheus's text format, read at each scrape from where they live.

Nothing is counted in this process. PostgreSQL holds videos, attempts, agent calls and webhook events; Redis
holds the waiting messages and what each gpu worker publishes. Asking them when Prometheus scrapes means any
`mas serve`, on any host, reports the same figures, and no restart loses one. Histograms are built from the
rows with fixed buckets; each table is read once per scrape, as aggregates.

What is not here, and why: grading seconds (no row records how long a grading took) and how long a message
has waited (a Celery message carries no sent time: only how many wait).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import redis
import sqlalchemy as sa
from kombu.transport.redis import PRIORITY_STEPS
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session
from starlette.requests import Request
from starlette.responses import Response

from mas import names
from mas.config import Settings
from mas.db import DatabaseUnavailable, session_scope
from mas.models import AgentCall, Attempt, Video, VideoState, WebhookEvent
from mas.pipeline.rows import RowFault
from mas.reports.queries import gpu_summary
from mas.runtime.app import app_for, queue_keys
from mas.runtime.clients import redis_client
from mas.runtime.services import ServiceError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Figure:
    """One metric family, declared once: the collector fills it, and the dashboard's test checks that every
    name the dashboard queries is one of these."""

    name: str
    help: str
    labels: tuple[str, ...] = ()
    suffixes: ClassVar[tuple[str, ...]] = ("",)

    @property
    def series(self) -> tuple[str, ...]:
        """The names its samples carry (what a query names)."""
        return tuple(self.name + suffix for suffix in self.suffixes)


class Gauge(Figure):
    def family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(self.name, self.help, labels=self.labels)


class Counter(Figure):
    suffixes = ("_total",)

    def family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self.name, self.help, labels=self.labels)


@dataclass(frozen=True)
class Histogram(Figure):
    buckets: tuple[float, ...] = ()  # upper bounds; +Inf is added
    suffixes = ("_bucket", "_count", "_sum")

    def family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self.name, self.help, labels=self.labels)


UP = Gauge("mas_source_up", "1 if this scrape could read the source (postgres, redis), else 0.", ("source",))
VIDEOS = Gauge(
    "mas_videos",
    "Videos by state and grade (grade 'none' until graded). Final states: accepted, failed, cancelled.",
    ("state", "grade"),
)
ATTEMPTS = Histogram("mas_accepted_video_attempts", "Attempts each accepted video took.", buckets=(1, 2, 3, 4, 5))
RENDER = Histogram(
    "mas_render_seconds",
    "Seconds each rendered attempt took, by backend.",
    ("backend",),
    buckets=(1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600),
)
AGENT_SECONDS = Histogram(
    "mas_agent_call_seconds",
    "Seconds each agent call took (all its tries), by task.",
    ("task",),
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
AGENT_TOKENS = Counter(
    "mas_agent_tokens",
    "Tokens of agent calls by task and kind: prompt, cached (the part of prompt served from the endpoint's "
    "prompt cache) and completion.",
    ("task", "kind"),
)
AGENT_INVALID = Counter("mas_agent_invalid_replies", "Agent calls that never gave a valid reply, by task.", ("task",))
WEBHOOKS = Gauge(
    "mas_webhook_events",
    "Webhook events in the outbox by state: delivered, pending (to be tried again), failed (tries spent).",
    ("state",),
)
WEBHOOK_OLDEST = Gauge(
    "mas_webhook_oldest_pending_seconds",
    "Age of the oldest webhook event still to be delivered (neither delivered nor given up; 0: none).",
)
ROW_FAULTS = Gauge(
    "mas_row_faults",
    "Rows a periodic job could not process, by the job's rows (schedules, webhooks, ...; not `job`, which is "
    "Prometheus's own label) and state: failing (tried again after its wait) or parked (its tries spent: skipped "
    "until `mas faults retry`).",
    ("rows", "state"),
)
WAITING = Gauge(
    "mas_queue_waiting",
    "Messages waiting in a queue, by its priority list (0 first: work that finishes what is started, 3 "
    "refinements, 6 new work). Messages carry no sent time, so how long they waited is not known.",
    ("queue", "priority"),
)
GPU_BUSY = Counter(
    "mas_gpu_busy_seconds",
    "Seconds a gpu worker's GPU was held by work since the worker started (published after each gpu task): "
    "its rate() is the busy fraction.",
    ("worker", "device"),
)
GPU_TURNS = Counter("mas_gpu_turns", "Turns work took on a gpu worker's GPU.", ("worker", "device"))
GPU_LOADS = Counter("mas_gpu_model_loads", "Models a gpu worker built from disk.", ("worker",))
GPU_SWAPS = Counter("mas_gpu_model_swaps", "Parked models a gpu worker brought back onto its GPU.", ("worker",))
GPU_EVICTIONS = Counter("mas_gpu_model_evictions", "Models a gpu worker moved off its GPU to make room.", ("worker",))
GPU_RESIDENT = Gauge("mas_gpu_resident_models", "Models on a gpu worker's GPU now.", ("worker",))

FIGURES: tuple[Figure, ...] = (
    UP, VIDEOS, ATTEMPTS, RENDER, AGENT_SECONDS, AGENT_TOKENS, AGENT_INVALID, WEBHOOKS, WEBHOOK_OLDEST,
    ROW_FAULTS, WAITING, GPU_BUSY, GPU_TURNS, GPU_LOADS, GPU_SWAPS, GPU_EVICTIONS, GPU_RESIDENT,
)  # fmt: skip

DATABASE_ERRORS = (DatabaseUnavailable, ServiceError, SQLAlchemyError)
BROKER_ERRORS = (redis.RedisError, ServiceError)


def metrics(request: Request) -> Response:
    """The route: every figure, read now (a plain function: Starlette runs it in its thread pool)."""
    registry = CollectorRegistry()
    registry.register(StudioCollector(request.app.state.settings))
    # the 0.0.4 text format: every Prometheus, old or new, reads it
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_PLAIN_0_0_4)


class StudioCollector(Collector):
    """Reads PostgreSQL and Redis on each collect. A source that cannot be read is 0 in `mas_source_up`, and
    the other source's figures are still served."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def collect(self) -> Iterator[Metric]:
        up = UP.family()
        for source, read, errors in (
            ("postgres", self._database, DATABASE_ERRORS),
            ("redis", self._broker, BROKER_ERRORS),
        ):
            try:
                families = list(read())  # all of a source or none of it
            except errors as exc:
                log.warning("metrics: %s could not be read: %s", source, exc)
                up.add_metric([source], 0)
                continue
            up.add_metric([source], 1)
            yield from families
        yield up

    def _database(self) -> Iterator[Metric]:
        with session_scope(self.settings) as session:
            yield _videos(session)
            yield _histogram(ATTEMPTS, session, Video.attempt_count, where=Video.state == VideoState.accepted)
            yield _histogram(
                RENDER, session, Attempt.render_seconds, where=Attempt.render_seconds.is_not(None), by=Attempt.backend
            )
            yield from _agent_calls(session)
            yield from _webhooks(session)
            yield _row_faults(session)

    def _broker(self) -> Iterator[Metric]:
        yield _waiting(self.settings)
        yield from _gpu_workers(self.settings)


def _videos(session: Session) -> Metric:
    family = VIDEOS.family()
    rows = session.execute(sa.select(Video.state, Video.grade, sa.func.count()).group_by(Video.state, Video.grade))
    for state, grade, count in rows:
        family.add_metric([state.value, grade or "none"], count)
    return family


def _histogram(figure: Histogram, session: Session, value: Any, *, where: Any, by: Any = None) -> Metric:
    """`figure` over the rows `where` selects (one per value of the column `by`), each bucket counted in SQL."""
    groups = [] if by is None else [by]
    counts = [sa.func.count().filter(value <= bound) for bound in figure.buckets]
    total = sa.func.coalesce(sa.func.sum(value), 0.0)
    stmt = sa.select(*groups, *counts, sa.func.count(), total).where(where).group_by(*groups)
    family = figure.family()
    for row in session.execute(stmt):
        labels, (*within, count, sum_value) = [str(label) for label in row[: len(groups)]], row[len(groups) :]
        if count == 0:
            continue  # no rows: an aggregate without groups still answers one row
        buckets = [(floatToGoString(bound), n) for bound, n in zip(figure.buckets, within)]
        family.add_metric(labels, [*buckets, ("+Inf", count)], sum_value=sum_value)
    return family


def _agent_calls(session: Session) -> Iterator[Metric]:
    yield _histogram(AGENT_SECONDS, session, AgentCall.seconds, where=sa.true(), by=AgentCall.task)
    tokens, invalid = AGENT_TOKENS.family(), AGENT_INVALID.family()
    stmt = sa.select(
        AgentCall.task,
        sa.func.sum(AgentCall.prompt_tokens),
        sa.func.sum(AgentCall.cached_tokens),
        sa.func.sum(AgentCall.completion_tokens),
        sa.func.count().filter(AgentCall.valid.is_(False)),
    ).group_by(AgentCall.task)
    for task, prompt, cached, completion, not_valid in session.execute(stmt):
        for kind, count in (("prompt", prompt), ("cached", cached), ("completion", completion)):
            tokens.add_metric([task, kind], count)
        invalid.add_metric([task], not_valid)
    yield tokens
    yield invalid


def _webhooks(session: Session) -> Iterator[Metric]:
    pending = sa.and_(WebhookEvent.delivered_at.is_(None), WebhookEvent.failed_at.is_(None))
    oldest = sa.func.min(WebhookEvent.created_at).filter(pending)
    delivered, waiting, failed, age = session.execute(
        sa.select(
            sa.func.count().filter(WebhookEvent.delivered_at.is_not(None)),
            sa.func.count().filter(pending),
            sa.func.count().filter(WebhookEvent.failed_at.is_not(None)),
            sa.func.coalesce(sa.func.extract("epoch", sa.func.now() - oldest), 0),
        )
    ).one()
    events = WEBHOOKS.family()
    for state, count in (("delivered", delivered), ("pending", waiting), ("failed", failed)):
        events.add_metric([state], count)
    oldest_age = WEBHOOK_OLDEST.family()
    oldest_age.add_metric([], float(age))
    yield events
    yield oldest_age


def _row_faults(session: Session) -> Metric:
    family = ROW_FAULTS.family()
    state = sa.case((RowFault.parked_at.is_(None), "failing"), else_="parked")
    for job, shown, count in session.execute(
        sa.select(RowFault.job, state, sa.func.count()).group_by(RowFault.job, state)
    ):
        family.add_metric([job, shown], count)
    return family


def _waiting(settings: Settings) -> Metric:
    """The length of each priority list of each queue: kombu keeps one list per priority step, the bare
    queue name for step 0 (as `queue_keys` lists them)."""
    app, client, family = app_for(settings), redis_client(settings), WAITING.family()
    steps = app.conf.broker_transport_options.get("priority_steps", PRIORITY_STEPS)
    levels = ["0", *(str(step) for step in steps if step)]
    for queue in dict.fromkeys(queue for queues in names.WORKER_QUEUES.values() for queue in queues):
        for key, level in zip(queue_keys(app, queue), levels):
            family.add_metric([queue, level], client.llen(key))
    return family


def _gpu_workers(settings: Settings) -> Iterator[Metric]:
    """What each gpu worker last published (after its latest gpu task); a worker's counters restart with it."""
    busy, turns, resident = GPU_BUSY.family(), GPU_TURNS.family(), GPU_RESIDENT.family()
    loads, swaps, evictions = GPU_LOADS.family(), GPU_SWAPS.family(), GPU_EVICTIONS.family()
    for worker in gpu_summary(settings).workers:
        busy.add_metric([worker.name, worker.device], worker.busy_seconds)
        turns.add_metric([worker.name, worker.device], worker.turns)
        if worker.loads is not None:  # None until the worker used a model of its own
            loads.add_metric([worker.name], worker.loads)
            swaps.add_metric([worker.name], worker.swaps or 0)
            evictions.add_metric([worker.name], worker.evictions or 0)
            resident.add_metric([worker.name], len(worker.resident))
    yield from (busy, turns, loads, swaps, evictions, resident)
