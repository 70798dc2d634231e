"""`Idempotency-Key` on a submit: a client that retries (its connection dropped before the answer came)
gets the batch its first try made instead of a second one.

The key is claimed in PostgreSQL before the work is submitted and given the batch's id after, per user. The
same key with the same request returns that batch; with another request it is refused (the key is being
reused by mistake); a key whose first try is still submitting answers "busy, try again". A submit that fails
frees its key, so the client's retry submits for real.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert

from mas.config import Settings
from mas.db import session_scope
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


def once(settings: Settings, key: str, body: dict, submit: Callable[[], tuple[int | None, int | None]]) -> Made:
    """Run `submit` (returning a batch id or a schedule id) once per (user, key, request)."""
    if not key or len(key) > MAX_KEY_CHARS or not key.isprintable():
        raise InvalidInput(f"an Idempotency-Key is 1 to {MAX_KEY_CHARS} printable characters")
    digest = fingerprint(body)
    with session_scope(settings) as session:
        claimed = session.execute(
            pg_insert(IdempotencyKey)
            .values(user_name=settings.user, key=key, request_hash=digest)
            .on_conflict_do_nothing()
            .returning(IdempotencyKey.key)
        ).scalar_one_or_none()
        if claimed is None:
            row = session.get_one(IdempotencyKey, (settings.user, key))
            if row.request_hash != digest:
                raise KeyReused(f"the Idempotency-Key {key!r} was used for another request; use a new key")
            if row.batch_id is None and row.schedule_id is None:
                raise KeyBusy(f"the request with Idempotency-Key {key!r} is still being submitted; try again")
            return Made(batch_id=row.batch_id, schedule_id=row.schedule_id, replayed=True)
    try:
        batch_id, schedule_id = submit()
    except BaseException:
        with session_scope(settings) as session:
            session.execute(
                sa.delete(IdempotencyKey).where(IdempotencyKey.user_name == settings.user, IdempotencyKey.key == key)
            )
        raise
    with session_scope(settings) as session:
        session.execute(
            sa.update(IdempotencyKey)
            .where(IdempotencyKey.user_name == settings.user, IdempotencyKey.key == key)
            .values(batch_id=batch_id, schedule_id=schedule_id)
        )
    return Made(batch_id=batch_id, schedule_id=schedule_id, replayed=False)
