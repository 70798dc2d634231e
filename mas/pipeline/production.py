"""Putting a request into production: a Batch row first (Postgres is the truth), then a message.

If sending fails after the commit, the batch stays `queued` and the reconcile job re-sends it. Every new batch
is counted against its user's quotas in the transaction that stores it (`mas.pipeline.quotas`).
"""

from __future__ import annotations

import socket
from datetime import UTC, datetime, timedelta
from typing import cast
from urllib.parse import urlsplit

import redis
import sqlalchemy as sa
from sqlalchemy.orm import Session

from mas import names
from mas.config import Settings
from mas.db import rows_changed, session_scope
from mas.domain.identity import Actor
from mas.domain.requests import ProductionRequest, RequestKind, parse_request
from mas.domain.steps import STARTS
from mas.errors import InvalidInput, PeerUnavailable
from mas.models import Batch, Schedule, User
from mas.names import Priority
from mas.outbox import eventlog, targets
from mas.pipeline import quotas, rows
from mas.redaction import redact_url
from mas.runtime import clients
from mas.runtime.app import app_for, queue_of
from mas.runtime.clients import redis_client


def priority_for(settings: Settings, request: ProductionRequest, asked: str | None) -> Priority:
    """The priority a request runs at: what was asked, else high for an A/B test (MAS_AB_PRIORITY: a person
    waits to pick), else normal."""
    if asked is not None:
        for priority in names.PRIORITIES:
            if asked == priority:
                return priority
        raise InvalidInput(f"unknown priority {asked!r}; use one of {', '.join(names.PRIORITIES)}")
    return settings.ab.priority if request.kind == "ab" else "normal"


def batch_priority(batch: Batch) -> Priority:
    """The priority a stored batch runs at."""
    return batch.priority


def request_of(batch: Batch) -> ProductionRequest:
    """What a stored batch asks for: its spec; a batch stored without one (written directly, not through
    `new_batch`) is rebuilt from its columns."""
    if batch.spec is not None:
        return ProductionRequest.from_json(batch.spec)
    series_name = ((batch.options or {}).get("series_name") or batch.theme) if batch.kind == "series" else None
    return ProductionRequest(
        kind=cast(RequestKind, batch.kind),
        count=batch.total,
        theme=batch.theme,
        series_name=series_name,
        text=batch.request,
    )


def new_batch(
    session: Session, request: ProductionRequest, *, priority: Priority, user: str, notify_url: str | None = None
) -> Batch:
    """A queued Batch row for `request`, flushed so it has its id; `user` is whose taste it is made for,
    `notify_url` the request's own webhook receiver. `kind`, `theme` and `total` repeat the spec for the
    readers of batches (status, gallery). A user's request is counted first, in the same transaction
    (`quotas.check`: `submit`, `run_due_schedules`)."""
    batch = Batch(
        request=request.text,
        kind=request.kind,
        theme=request.theme,
        total=request.count,
        user_name=user,
        spec=request.to_json(),
        priority=priority,
        notify_url=notify_url,
    )
    session.add(batch)
    session.flush()
    eventlog.batch_changed(session, "batch.created", batch, kind=batch.kind, total=batch.total)
    return batch


class BrokerUnavailable(PeerUnavailable):
    """Redis (the broker or the result backend) does not answer: nothing was stored or sent."""


def check_broker(settings: Settings) -> None:
    """Ask the broker and the result backend to answer before a request is stored, so a request that
    cannot be sent is refused whole instead of left half-done."""
    urls = {settings.effective_broker_url, settings.effective_result_backend}
    for url in sorted(urls):
        try:
            client = (
                redis_client(settings)
                if url == settings.effective_broker_url
                else clients.connect(settings, url, socket_connect_timeout=5, socket_timeout=5)
            )
            client.ping()
        except (redis.RedisError, OSError, ValueError) as exc:
            raise BrokerUnavailable(
                f"Redis at {redact_url(url)} does not answer ({type(exc).__name__}); nothing was queued: start it "
                f"(`mas up` for the embedded one) and try again"
            ) from None


def check_notify_url(
    settings: Settings, actor: Actor, url: str | None, *, resolver: targets.Resolver = socket.getaddrinfo
) -> str | None:
    """A request's webhook URL: http(s), only when events can be signed (MAS_WEBHOOK_SECRET), and only to a
    host whose every address webhooks may go to (`mas.outbox.targets`: not loopback, private, link-local ...
    unless MAS_WEBHOOK_ALLOWED_HOSTS allows it). A host that does not resolve is refused too. Each delivery
    checks again. The secret is the studio's, or `actor`'s own (their `users` row)."""
    if url is None:
        return None
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises for a port that is not 0-65535)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or len(url) > 2000:
        raise InvalidInput(f"the webhook URL {redact_url(url)!r} is not an http(s) URL; nothing was queued")
    if settings.webhooks.secret is None and not _has_own_secret(settings, actor):
        raise InvalidInput(
            "a webhook URL needs MAS_WEBHOOK_SECRET set, or the user's own secret (`mas users set NAME "
            "--webhook-secret ...`): events are signed; nothing was queued"
        )
    try:
        targets.check_url(url, targets.rules(settings, resolver), resolver)
    except targets.TargetError as exc:
        raise InvalidInput(f"the webhook URL {redact_url(url)!r} {exc}; nothing was queued") from None
    return url


def _has_own_secret(settings: Settings, actor: Actor) -> bool:
    with session_scope(settings) as session:
        return bool(session.scalar(sa.select(User.webhook_secret).where(User.name == actor.user)))


def submit(
    settings: Settings,
    actor: Actor,
    request: ProductionRequest,
    *,
    priority: str | None = None,
    notify_url: str | None = None,
) -> int:
    """Store `actor`'s request as a batch and send it to the Director; return the batch id. Refused whole (nothing
    stored) when the broker does not answer or the user's quotas have no room for it."""
    priority = priority_for(settings, request, priority)
    notify_url = check_notify_url(settings, actor, notify_url)
    check_broker(settings)
    with session_scope(settings) as session:
        quotas.check(settings, session, actor, request.count)  # the user's lock, held until the commit
        batch_id = new_batch(session, request, priority=priority, user=actor.user, notify_url=notify_url).id
    send_plan(settings, batch_id, priority=priority)
    return batch_id


LATE_GRACE = timedelta(days=1)
"""How far past a schedule's time may be when it is given (a client's clock, an hour that just went by): it
starts at once. Further back is a mistake."""


def check_run_at(settings: Settings, run_at: datetime) -> None:
    """Refuse a schedule's time without a time zone, or outside [now - LATE_GRACE, now +
    MAS_SCHEDULE_MAX_DAYS_AHEAD]: a time near the ends of the calendar (year 1 at +14:00) is out of
    PostgreSQL's range once in UTC, and no one means it."""
    if run_at.tzinfo is None or run_at.utcoffset() is None:
        raise InvalidInput("a schedule's time needs a time zone, e.g. 2026-12-01T02:00:00+00:00")
    days = settings.scheduling.schedule_max_days_ahead
    now = datetime.now(UTC)
    if not now - LATE_GRACE <= run_at <= now + timedelta(days=days):
        raise InvalidInput(
            f"a schedule's time must be from a day ago to {days:g} days ahead (MAS_SCHEDULE_MAX_DAYS_AHEAD), "
            f"got {run_at.isoformat()}"
        )


def schedule(
    settings: Settings,
    actor: Actor,
    request: ProductionRequest,
    *,
    run_at: datetime,
    priority: str | None = None,
    notify_url: str | None = None,
) -> int:
    """Store `actor`'s request to be enqueued at `run_at` (an overnight batch); return the schedule id."""
    check_run_at(settings, run_at)
    priority = priority_for(settings, request, priority)
    notify_url = check_notify_url(settings, actor, notify_url)
    with session_scope(settings) as session:
        row = Schedule(
            run_at=run_at,
            request=request.text,
            spec=request.to_json(),
            priority=priority,
            user_name=actor.user,
            notify_url=notify_url,
        )
        session.add(row)
        session.flush()
        return row.id


SCHEDULES_JOB = "schedules"
"""The schedules' job in `mas.pipeline.rows`: a schedule that cannot be run is marked, tried again, parked."""


def run_due_schedules(settings: Settings) -> list[int]:
    """Turn every due schedule into a batch, exactly once, and send the batches; return their ids.

    Each schedule is claimed with SKIP LOCKED and its batch created in the transaction that marks it sent, so
    two beats or a restarted beat never run a schedule twice. A crash between the commit and the send leaves a
    queued batch, which the reconcile job sends. The user's quotas are counted now, when the batch is made: a
    schedule they refuse ends `failed` with the reason (`Schedule.failure_reason`), never tried again. A
    schedule that cannot be run at all (a time or a request that cannot be read) is marked with its error and
    tried again later, then parked (`mas.pipeline.rows`): it never holds up the schedules after it.
    """
    with session_scope(settings) as session:  # ids only: a whole row may be what cannot be read
        due = session.scalars(
            sa.select(Schedule.id)
            .where(Schedule.status == "scheduled", Schedule.run_at <= sa.func.now())
            .order_by(Schedule.run_at, Schedule.id)
        ).all()
    ran = rows.each(settings, SCHEDULES_JOB, due, lambda schedule_id: _run_schedule(settings, schedule_id))
    return [batch_id for batch_id in ran.done.values() if batch_id is not None]


def _run_schedule(settings: Settings, schedule_id: int) -> int | None:
    """Make the batch of one due schedule and send it; its id, or None when another beat took the schedule or
    its user's quotas refused it."""
    with session_scope(settings) as session:
        row = session.scalars(
            sa.select(Schedule)
            .where(Schedule.id == schedule_id, Schedule.status == "scheduled")
            .with_for_update(skip_locked=True)
        ).first()
        if row is None:
            return None
        # one stored before requests were typed has no spec: migration 0005 leaves its text to the parser
        request = parse_request(row.request, settings) if row.spec is None else ProductionRequest.from_json(row.spec)
        try:
            quotas.check(settings, session, Actor(row.user_name), request.count)
        except (quotas.QuotaExceeded, quotas.LargerThanQuota) as exc:
            row.status = "failed"
            row.options = {**(row.options or {}), "failure_reason": str(exc)}
            return None
        batch = new_batch(session, request, priority=row.priority, user=row.user_name, notify_url=row.notify_url)
        row.batch_id, row.status = batch.id, "sent"
        priority = row.priority
    send_plan(settings, batch.id, priority=priority)
    return batch.id


def cancel_schedule(settings: Settings, schedule_id: int) -> bool:
    """Cancel a schedule that has not run; False when there is no such pending schedule."""
    with session_scope(settings) as session:
        cancelled = (
            sa.update(Schedule)
            .where(Schedule.id == schedule_id, Schedule.status == "scheduled")
            .values(status="cancelled")
        )
        return rows_changed(session, cancelled) == 1


def send_plan(settings: Settings, batch_id: int, *, priority: Priority) -> None:
    """Ask the Director to plan a stored batch (a cpu worker picks it up)."""
    app = app_for(settings)
    app.send_task(
        names.PLAN_BATCH, args=[batch_id], queue=queue_of(app, names.PLAN_BATCH, priority=priority), priority=STARTS
    )


def resume(settings: Settings, batch_ids: list[int]) -> None:
    """Restart batches a previous session left pending: each goes on from what Postgres says is done."""
    app = app_for(settings)
    for batch_id in batch_ids:
        app.send_task(names.RESUME_BATCH, args=[batch_id], priority=STARTS)
