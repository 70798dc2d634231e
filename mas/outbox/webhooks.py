"""Delivering the webhook outbox (`mas.outbox.events`) to other programs: signed, at least once, in order per batch
and receiver, and never in the pipeline's way.

Each event is signed by the Standard Webhooks scheme (headers `webhook-id`, `webhook-timestamp`,
`webhook-signature`: an HMAC-SHA256 of "id.timestamp.body" under MAS_WEBHOOK_SECRET). Its id is the same on
every try, so a receiver drops repeats. A deliverer claims due rows with `FOR UPDATE SKIP LOCKED` in a short
transaction that also moves their next try past the time a send may take, so two deliverers never send one
row at once and a deliverer killed mid-send leaves its rows due again a moment later; it then sends with no
transaction open, all of a round's events at once, and records each answer. A 2xx answer delivers the event;
anything else backs it off (2 s, doubling, at most an hour, with jitter) until MAS_WEBHOOK_MAX_ATTEMPTS tries
are spent and it is given up. A receiver's failure is recorded, never raised.

Before each send the receiver's host is resolved and every address checked (`mas.outbox.targets`), and the
connection goes to the address checked, with the Host header and TLS (SNI, certificate) naming the host: a
name that resolves to an internal address by the time it is delivered is caught then, not only when it was
submitted. A receiver refused for its address is given up at once (its reason kept, as for any given-up
event); one whose name does not resolve is tried again like any other failure. Redirects are never followed
(a 3xx is a failure), proxies from the environment never used (they would resolve the name again), and no
connection is kept for a next request (a TLS connection was verified for one name).

A batch's events reach a receiver in the order they were written: an event is due only when every earlier
event of its batch and receiver is delivered or given up.
"""

from __future__ import annotations

import json
import logging
import random
import socket
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import sqlalchemy as sa
from sqlalchemy.orm import aliased
from standardwebhooks.webhooks import EmptyWebhookSecretError, Webhook

from mas.config import Settings
from mas.db import readable, session_scope
from mas.errors import InvalidSettings, StudioError
from mas.models import Batch, User, WebhookEvent
from mas.outbox import targets
from mas.redaction import redact_text, redact_url
from mas.runtime import failover

log = logging.getLogger(__name__)

FIRST_BACKOFF_S = 2.0
"""The wait after a first failed try; each further failure doubles it."""

MAX_BACKOFF_S = 3600.0
"""The longest wait between two tries of one event."""

MAX_SENDERS = 8
"""Events of one round sent at once: a slow receiver costs a round one timeout per wave, not one per event."""

CLAIM_MARGIN_S = 5.0
"""Added to the time a round's sends may take (MAS_WEBHOOK_TIMEOUT_SECONDS per wave of MAX_SENDERS) when a
claim moves its events' next try ahead, so no other deliverer sends them meanwhile."""

ERROR_CHARS = 300
"""How much of a failure's description is kept."""


class WebhookError(StudioError):
    """Webhook delivery could not run (a receiver's failure is not one: it is recorded on its event)."""


class SigningSecretUnusable(WebhookError, InvalidSettings):
    """Events wait to be delivered, but MAS_WEBHOOK_SECRET is not set or is not whsec_ + base64."""


@dataclass(kw_only=True)
class DeliveryReport:
    """What one or more rounds of delivery did, by event id."""

    delivered: list[str] = field(default_factory=list)
    retrying: list[str] = field(default_factory=list)  # failed this try, tried again later
    failed: list[str] = field(default_factory=list)  # failed this try, its last: given up

    @property
    def tried(self) -> int:
        return len(self.delivered) + len(self.retrying) + len(self.failed)

    def add(self, other: DeliveryReport) -> None:
        self.delivered += other.delivered
        self.retrying += other.retrying
        self.failed += other.failed


@dataclass(frozen=True, kw_only=True)
class _Claimed:
    """An event as the claim read it: what is sent, and the tries it had."""

    seq: int
    id: str
    url: str
    payload: dict[str, Any]
    attempts: int
    secret: str | None  # the batch's user's own secret, for their request's receiver; else the studio's


@dataclass(frozen=True)
class _Answer:
    """What one try came to: None when the receiver took it, else what went wrong, and whether to give up now."""

    error: str | None = None
    final: bool = False


def signer(settings: Settings, secret: str | None = None) -> Webhook:
    """The Standard Webhooks signer of `secret` (a user's own), else of MAS_WEBHOOK_SECRET."""
    if secret is None and settings.webhooks.secret is None:
        raise SigningSecretUnusable("webhook events wait to be delivered but MAS_WEBHOOK_SECRET is not set")
    try:
        return Webhook(secret or settings.webhooks.secret.get_secret_value())  # type: ignore[union-attr]
    except (ValueError, EmptyWebhookSecretError):
        raise SigningSecretUnusable("a webhook secret must be whsec_ followed by base64 (of random bytes)") from None


def backoff_seconds(attempts: int) -> float:
    """The wait after the `attempts`-th failed try: 2 s doubling up to an hour, less up to a fifth at random so
    events that failed together spread out."""
    return min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** min(attempts - 1, 20)) * random.uniform(0.8, 1.0)


def deliver_due(
    settings: Settings, *, limit: int = 50, resolver: targets.Resolver = socket.getaddrinfo
) -> DeliveryReport:
    """One round: claim up to `limit` due events, send them, record each answer. Raises only when delivery
    cannot run at all (no usable secret, the database away), never for a receiver. `resolver` resolves the
    receivers' hosts (tests inject one)."""
    report = DeliveryReport()
    try:
        studio: Webhook | None = signer(settings)
    except SigningSecretUnusable:
        if _needs_studio_secret(settings):  # a studio without webhooks has no secret and nothing to send
            raise
        studio = None
    claimed, unreadable = _claim(settings, limit=limit)
    if not claimed and not unreadable:
        return report
    rules = targets.rules(settings, resolver)
    answers: list[_Answer] = []
    if claimed:
        with (
            _client(settings) as client,
            ThreadPoolExecutor(max_workers=min(MAX_SENDERS, len(claimed))) as pool,
        ):
            answers = list(pool.map(lambda event: _try(settings, client, studio, event, rules, resolver), claimed))
    secrets = settings.secret_values()
    with session_scope(settings) as session:
        for event, answer in [*zip(claimed, answers, strict=True), *unreadable]:
            shown = None if answer.error is None else redact_text(answer.error, secrets)[:ERROR_CHARS]
            _record(session, settings, event, _Answer(shown, answer.final), report)
    return report


def _try(
    settings: Settings,
    client: httpx.Client,
    studio: Webhook | None,
    event: _Claimed,
    rules: targets.Rules,
    resolver: targets.Resolver,
) -> _Answer:
    """One event's try; whatever it raises is its failure, never the round's."""
    try:
        return _send(client, _signer_of(settings, event, studio), event, rules, resolver)
    except Exception as exc:
        return _failure(exc)


def _signer_of(settings: Settings, event: _Claimed, studio: Webhook | None) -> Webhook | None:
    if event.secret is not None:
        try:
            return signer(settings, event.secret)
        except SigningSecretUnusable:
            return None
    return studio


def _user_secret() -> sa.ScalarSelect:
    """The secret of the event's batch's user, when the event goes to the request's own receiver."""
    return (
        sa.select(User.webhook_secret)
        .join(Batch, Batch.user_name == User.name)
        .where(Batch.id == WebhookEvent.batch_id, Batch.notify_url == WebhookEvent.url)
        .scalar_subquery()
    )


def _needs_studio_secret(settings: Settings) -> bool:
    with session_scope(settings) as session:
        unfinished = sa.and_(WebhookEvent.delivered_at.is_(None), WebhookEvent.failed_at.is_(None))
        return bool(session.scalar(sa.select(sa.exists().where(unfinished, _user_secret().is_(None)))))


def _client(settings: Settings) -> httpx.Client:
    """The client of a round: no proxy from the environment (an explicit transport), no connection kept once
    its answer is read, no redirect followed; certificates verified (SSL_CERT_FILE / SSL_CERT_DIR honoured)."""
    transport = httpx.HTTPTransport(limits=httpx.Limits(max_keepalive_connections=0))
    return httpx.Client(
        transport=transport,
        timeout=settings.webhooks.timeout_seconds,
        headers={"user-agent": "mas-webhooks"},
        follow_redirects=False,
    )


def _due(limit: int) -> sa.Select:
    """Events to try now, oldest first, each the earliest unfinished one of its batch and receiver; rows
    another deliverer is claiming are skipped. Only the columns that are always readable: an event's payload
    is read on its own (`_claim`)."""
    event, earlier = WebhookEvent, aliased(WebhookEvent)
    unfinished = sa.and_(event.delivered_at.is_(None), event.failed_at.is_(None))
    waits_on_earlier = sa.exists().where(
        earlier.url == event.url,
        earlier.batch_id.is_not_distinct_from(event.batch_id),
        earlier.seq < event.seq,
        earlier.delivered_at.is_(None),
        earlier.failed_at.is_(None),
    )
    return (
        sa.select(event.seq, event.id, event.url, event.attempts)
        .where(unfinished, event.next_attempt_at <= sa.func.now(), ~waits_on_earlier)
        .order_by(event.seq)
        .limit(limit)
        .with_for_update(of=event, skip_locked=True)
    )


def _claim(settings: Settings, *, limit: int) -> tuple[list[_Claimed], list[tuple[_Claimed, _Answer]]]:
    """Lock the due events and move their next try past this send (committed at once: no transaction stays
    open while receivers are called). Each event's payload and secret are read on its own: one that cannot be
    read (a number too long for Python) is this try's failure, beside the events that are sent."""
    waves = -(-limit // MAX_SENDERS)
    hold = timedelta(seconds=waves * settings.webhooks.timeout_seconds + CLAIM_MARGIN_S)
    claimed: list[_Claimed] = []
    unreadable: list[tuple[_Claimed, _Answer]] = []
    with session_scope(settings) as session:
        due = session.execute(_due(limit)).all()
        if not due:
            return claimed, unreadable
        session.execute(
            sa.update(WebhookEvent)
            .where(WebhookEvent.seq.in_([row.seq for row in due]))
            .values(next_attempt_at=sa.func.now() + hold)
            .execution_options(synchronize_session=False)
        )
        for seq, event_id, url, attempts in due:
            event = _Claimed(seq=seq, id=event_id, url=url, payload={}, attempts=attempts, secret=None)
            try:
                with session.begin_nested():
                    payload, secret = session.execute(
                        sa.select(WebhookEvent.payload, _user_secret()).where(WebhookEvent.seq == seq)
                    ).one()
            except Exception as exc:
                if failover.is_away(exc):
                    raise
                cause = exc.orig if isinstance(exc, sa.exc.DBAPIError) and exc.orig is not None else exc
                unreadable.append((event, _Answer(f"unreadable: {_failure(cause).error}")))
                continue
            claimed.append(replace(event, payload=payload, secret=secret))
    return claimed, unreadable


def _send(
    client: httpx.Client, webhook: Webhook | None, event: _Claimed, rules: targets.Rules, resolver: targets.Resolver
) -> _Answer:
    """Check the receiver's address and POST one signed event to it; what the try came to."""
    if webhook is None:
        return _Answer("no usable signing secret: set MAS_WEBHOOK_SECRET or the user's own (mas users set)")
    try:
        url = httpx.URL(event.url)
        if url.scheme not in ("http", "https") or not url.raw_host:
            raise targets.TargetRefused("is not an http(s) URL with a host")
        name = url.raw_host.decode("ascii")  # as httpx would connect: an international name in its xn-- form
        target = targets.check_host(name, url.port or (443 if url.scheme == "https" else 80), rules, resolver)
    except targets.TargetRefused as exc:
        return _Answer(f"refused: the receiver {exc}", final=True)
    except targets.TargetUnresolved as exc:
        return _Answer(f"the receiver {exc}")
    except httpx.InvalidURL as exc:
        return _Answer(f"{type(exc).__name__}: {exc}")
    body = json.dumps(event.payload, separators=(",", ":"))
    now = datetime.now(UTC)
    headers = {
        "content-type": "application/json",
        "webhook-id": event.id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": webhook.sign(event.id, now, body),
        "host": url.netloc.decode("ascii"),  # the name (and port) of the URL, not the address connected to
    }
    answer = _Answer("the receiver has no address")
    for address in target.addresses:  # the next address only when this one refuses the connection at once
        try:
            return _post(client, url.copy_with(host=address), body, headers, sni_hostname=name)
        except httpx.ConnectError as exc:
            answer = _failure(exc)
    return answer


def _post(client: httpx.Client, url: httpx.URL, body: str, headers: dict[str, str], *, sni_hostname: str) -> _Answer:
    """POST to the address `url` names, with TLS naming `sni_hostname`; raises httpx.ConnectError only."""
    try:
        with client.stream(
            "POST", url, content=body.encode(), headers=headers, extensions={"sni_hostname": sni_hostname}
        ) as response:
            status = response.status_code  # the body is not read: a receiver's answer is its status
    except httpx.ConnectError:
        raise
    except (httpx.HTTPError, httpx.InvalidURL, OSError, ValueError) as exc:
        return _failure(exc)
    return _Answer() if 200 <= status < 300 else _Answer(f"HTTP {status}")


def _failure(exc: Exception) -> _Answer:
    return _Answer(f"{type(exc).__name__}: {exc}".strip().rstrip(":"))


def _record(session, settings: Settings, event: _Claimed, answer: _Answer, report: DeliveryReport) -> None:
    """The answer of one try: delivered, or backed off, or given up (refused, or its tries spent)."""
    tries, error = event.attempts + 1, answer.error
    values: dict[str, Any] = {"attempts": WebhookEvent.attempts + 1}
    if error is None:
        values["delivered_at"] = sa.func.now()
        report.delivered.append(event.id)
    elif answer.final or tries >= settings.webhooks.max_attempts:
        values.update(failed_at=sa.func.now(), last_error=error)
        report.failed.append(event.id)
        log.warning("webhook %s to %s given up after %d tries: %s", event.id, redact_url(event.url), tries, error)
    else:
        wait = timedelta(seconds=backoff_seconds(tries))
        values.update(next_attempt_at=sa.func.now() + wait, last_error=error)
        report.retrying.append(event.id)
        log.info(
            "webhook %s to %s failed (try %d), again in %.0f s: %s",
            event.id,
            redact_url(event.url),
            tries,
            wait.total_seconds(),
            error,
        )
    session.execute(
        sa.update(WebhookEvent)
        .where(WebhookEvent.seq == event.seq, WebhookEvent.delivered_at.is_(None), WebhookEvent.failed_at.is_(None))
        .values(**values)
        .execution_options(synchronize_session=False)
    )


def _listed() -> sa.Select:
    """What `mas webhooks` shows of an event: never its payload, and its times only where Python can hold them, so
    an event that cannot be read is listed as it is instead of stopping the listing."""
    event = WebhookEvent
    return sa.select(
        event.id,
        event.type,
        event.batch_id,
        event.url,
        event.attempts,
        event.last_error,
        readable(event.next_attempt_at).label("next_attempt_at"),
        readable(event.failed_at).label("failed_at"),
    )


def pending(settings: Settings, *, limit: int = 100) -> list[sa.Row]:
    """Events not delivered yet and not given up, oldest first (`mas webhooks`)."""
    with session_scope(settings) as session:
        query = _listed().where(WebhookEvent.delivered_at.is_(None), WebhookEvent.failed_at.is_(None))
        return list(session.execute(query.order_by(WebhookEvent.seq).limit(limit)))


def failed(settings: Settings, *, limit: int = 100) -> list[sa.Row]:
    """Events given up after MAS_WEBHOOK_MAX_ATTEMPTS tries, newest first (`mas webhooks`)."""
    with session_scope(settings) as session:
        query = _listed().where(WebhookEvent.failed_at.is_not(None))
        return list(session.execute(query.order_by(WebhookEvent.seq.desc()).limit(limit)))
