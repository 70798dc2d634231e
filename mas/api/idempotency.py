"""`Idempotency-Key` on a submit: a client that retries (its connection dropped before the answer came)
gets the batch its first try made instead of a second one.

The key is claimed in PostgreSQL before the work is submitted and given the batch's id after, per user. The
same key with the same request returns that batch; with another request it is refused (the key is being
reused by mistake); a key whose first try is still submitting answers "busy, try again". A submit that fails
frees its key, so the client's retry submits for real.

Keys do not live for ever: one older than MAS_IDEMPOTENCY_KEY_HOURS counts as never used (a submit with it
makes a new batch) and the beat job `expire_idempotency_keys` deletes it. A key left busy by a process that
died between the claim and the submit's end is taken over by a retry once it is older than
MAS_IDEMPOTENCY_BUSY_SECONDS (longer than a submit can take). A takeover is one conditional UPDATE, so of two
retries at once only one takes the key; the claim's time (`created_at`, set anew by a takeover) is the
claim's token, so a process that was only slow cannot write its batch over the new claim's.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from mas.config import Settings
from mas.db import session_scope
from mas.domain.identity import Actor
from mas.errors import InvalidInput, RetryableError
from mas.models import IdempotencyKey

MAX_KEY_CHARS = 200


class KeyReused(InvalidInput):
    """The key was used before for a different request."""


class KeyBusy(RetryableError):
    """The first request with this key is still being submitted."""


@dataclass(frozen=True, kw_only=True)
class Made:
    batch_id: int | None
    schedule_id: int | None
    replayed: bool


def fingerprint(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def once(
    settings: Settings, actor: Actor, key: str, body: dict, submit: Callable[[], tuple[int | None, int | None]]
) -> Made:
    """Run `submit` (returning a batch id or a schedule id) once per (`actor`, key, request)."""
    if not key or len(key) > MAX_KEY_CHARS or not key.isprintable():
        raise InvalidInput(f"an Idempotency-Key is 1 to {MAX_KEY_CHARS} printable characters")
    digest = fingerprint(body)
    with session_scope(settings) as session:
        claimed = _claim(session, settings, actor, key, digest)
        if claimed is None:
            row = session.get(IdempotencyKey, (actor.user, key))
            if row is None:  # its submit failed and freed it since: the next try claims it
                raise KeyBusy(f"the request with Idempotency-Key {key!r} is still being submitted; try again")
            if row.request_hash != digest:
                raise KeyReused(f"the Idempotency-Key {key!r} was used for another request; use a new key")
            if row.batch_id is None and row.schedule_id is None:
                raise KeyBusy(f"the request with Idempotency-Key {key!r} is still being submitted; try again")
            return Made(batch_id=row.batch_id, schedule_id=row.schedule_id, replayed=True)
    ours = sa.and_(_key(actor, key), IdempotencyKey.created_at == claimed)  # still our claim
    try:
        batch_id, schedule_id = submit()
    except BaseException:
        with session_scope(settings) as session:
            session.execute(sa.delete(IdempotencyKey).where(ours))
        raise
    with session_scope(settings) as session:
        session.execute(
            sa.update(IdempotencyKey)
            .where(ours)
            .values(batch_id=batch_id, schedule_id=schedule_id)
            .execution_options(synchronize_session=False)
        )
    return Made(batch_id=batch_id, schedule_id=schedule_id, replayed=False)


def _key(actor: Actor, key: str) -> sa.ColumnElement[bool]:
    return sa.and_(IdempotencyKey.user_name == actor.user, IdempotencyKey.key == key)


def _expired(settings: Settings) -> sa.ColumnElement[bool]:
    return IdempotencyKey.created_at < sa.func.now() - timedelta(hours=settings.service.idempotency_key_hours)


def _claim(session: Session, settings: Settings, actor: Actor, key: str, digest: str) -> datetime | None:
    """Claim the key for this request: a new key, an expired one, or one left busy past the bound by the same
    request. The claim's time, or None when the key is someone else's (done, busy or another request's)."""
    claimed = session.execute(
        pg_insert(IdempotencyKey)
        .values(user_name=actor.user, key=key, request_hash=digest)
        .on_conflict_do_nothing()
        .returning(IdempotencyKey.created_at)
    ).scalar_one_or_none()
    if claimed is not None:
        return claimed
    abandoned = sa.and_(
        IdempotencyKey.request_hash == digest,
        IdempotencyKey.batch_id.is_(None),
        IdempotencyKey.schedule_id.is_(None),
        IdempotencyKey.created_at < sa.func.now() - timedelta(seconds=settings.service.idempotency_busy_seconds),
    )
    # one statement: of two retries at once, the second re-reads the row the first took, no longer old
    return session.execute(
        sa.update(IdempotencyKey)
        .where(_key(actor, key), sa.or_(_expired(settings), abandoned))
        .values(request_hash=digest, batch_id=None, schedule_id=None, created_at=sa.func.now())
        .returning(IdempotencyKey.created_at)
        .execution_options(synchronize_session=False)
    ).scalar_one_or_none()


def delete_expired(settings: Settings) -> int:
    """Delete every user's keys older than MAS_IDEMPOTENCY_KEY_HOURS; how many."""
    with session_scope(settings) as session:
        result = session.execute(
            sa.delete(IdempotencyKey).where(_expired(settings)).execution_options(synchronize_session=False)
        )
        return int(result.rowcount)  # type: ignore[attr-defined]
