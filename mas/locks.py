"""PostgreSQL advisory locks keyed by name: one helper for every "one at a time" in the studio.

Names come from `mas.names`; the 64-bit key is derived from the name, so nobody numbers keys by hand.
Locks are transaction-level: the database releases them when the transaction ends or its holder dies.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import sqlalchemy as sa

from mas.errors import RetryableError


class LockTimeout(RetryableError):
    """Another process held the lock longer than the caller was willing to wait."""


class LockBusy(RetryableError):
    """Another process holds the lock right now (for callers that do not wait)."""


def lock_key(name: str) -> int:
    """A stable signed 64-bit key for `pg_advisory_xact_lock`, derived from the lock's name."""
    return int.from_bytes(hashlib.sha256(f"mas:{name}".encode()).digest()[:8], "big", signed=True)


def acquire(conn: sa.Connection, name: str, *, timeout_s: float | None = None) -> None:
    """Take the lock inside `conn`'s open transaction, waiting at most `timeout_s` (None: for ever)."""
    if timeout_s is not None:
        conn.execute(sa.text(f"set local lock_timeout = '{max(1, int(timeout_s * 1000))}ms'"))
    try:
        conn.execute(sa.text("select pg_advisory_xact_lock(:k)"), {"k": lock_key(name)})
    except sa.exc.OperationalError as exc:
        if "lock timeout" not in str(exc.orig or exc):
            raise
        raise LockTimeout(f"waited over {timeout_s:g} s for lock {name!r}: another process holds it") from exc


@contextmanager
def held(engine: sa.Engine, name: str, *, timeout_s: float | None = None) -> Iterator[sa.Connection]:
    """Hold the lock for the duration of the block (its own connection and transaction)."""
    with engine.connect() as conn, conn.begin():
        acquire(conn, name, timeout_s=timeout_s)
        yield conn


@contextmanager
def held_or_busy(engine: sa.Engine, name: str, *, busy: str) -> Iterator[sa.Connection]:
    """Hold the lock for the block, or raise `LockBusy(busy)` at once if another process holds it."""
    with engine.connect() as conn, conn.begin():
        if not _try(conn, name):
            raise LockBusy(busy)
        yield conn


ANY_WAIT_STEP_S = 0.5
"""How long `held_any` waits on one busy lock before trying all of them again."""


@contextmanager
def held_any(engine: sa.Engine, names: Sequence[str], *, timeout_s: float) -> Iterator[str]:
    """Hold the first free lock of `names` (tried in order) for the block and give its name.

    When all are held, wait on one of them at random (woken the moment it is released), trying all again
    every `ANY_WAIT_STEP_S`; after `timeout_s` raise LockTimeout. A pool of interchangeable resources (a
    role's conversations, an endpoint's slots) is a list of names.
    """
    if not names:
        raise ValueError("held_any needs at least one lock name")
    deadline = time.monotonic() + timeout_s
    with engine.connect() as conn:
        while True:
            transaction = conn.begin()
            name = _first_free(conn, names)
            if name is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    transaction.rollback()
                    raise LockTimeout(f"waited over {timeout_s:g} s for any of {len(names)} locks {names[0]!r}, ...")
                name = random.choice(names)
                try:
                    acquire(conn, name, timeout_s=min(ANY_WAIT_STEP_S, left))
                except LockTimeout:
                    transaction.rollback()
                    continue
            break
        with transaction:
            yield name


def _first_free(conn: sa.Connection, names: Sequence[str]) -> str | None:
    return next((name for name in names if _try(conn, name)), None)


def _try(conn: sa.Connection, name: str) -> bool:
    """Take the lock in `conn`'s open transaction if nobody holds it; whether it was taken."""
    return bool(conn.scalar(sa.text("select pg_try_advisory_xact_lock(:k)"), {"k": lock_key(name)}))
