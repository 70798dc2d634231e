"""A periodic job's rows, one at a time: a row that fails is marked with its error and skipped, so it never stops
the rows after it, nor another user's.

A job lists the keys of its rows (ids, names, paths: never whole rows, whose reading may itself be what fails,
as a time PostgreSQL keeps but Python cannot hold) and hands them to `each` with the work of one key. A key
whose work raises gets a `RowFault` (job, key): its error, its tries, when it is tried again (MAS_ROW_RETRY_SECONDS,
doubling up to an hour) and, once MAS_ROW_MAX_TRIES are spent, parked: skipped until a person sees to it and
releases it (`release`, `mas faults retry`). A key whose work succeeds again loses its fault. Listings read the faults (`faults`) to show a bad row as bad.

What is nobody's row fails the run instead: the database away or failing over, the broker's connection lost.
Marking every row with it would park good rows; the job's next run finds them again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Generic, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Mapped, mapped_column

from mas.config import Settings
from mas.db import session_scope
from mas.models import Base
from mas.pipeline.outcomes import LOST_CONNECTION
from mas.redaction import redact_text
from mas.runtime import failover
from mas.runtime.embedded.common import first_line
from mas.text import visible

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
R = TypeVar("R")

MAX_RETRY_SECONDS = 3600.0
"""The longest wait before a failed row is tried again."""

ERROR_CHARS = 500
"""How much of a failure's description is kept."""


class RowFault(Base):
    """A row a periodic job could not process: its error, tries so far, its next try, and when it was parked."""

    __tablename__ = "row_faults"

    job: Mapped[str] = mapped_column(sa.String(40), primary_key=True)  # "schedules", "buffers", ...
    key: Mapped[str] = mapped_column(sa.Text, primary_key=True)  # the row's key as text: an id, a name, a path
    error: Mapped[str] = mapped_column(sa.Text)
    attempts: Mapped[int] = mapped_column(sa.Integer)
    next_try_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True))
    parked_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))  # tries spent: skipped for good
    failed_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), server_default=sa.func.now())


@dataclass(frozen=True, kw_only=True)
class Fault:
    """What a listing shows of a bad row."""

    error: str
    attempts: int
    next_try_at: datetime
    parked: bool

    @classmethod
    def of(cls, row: RowFault) -> Fault:
        return cls(error=row.error, attempts=row.attempts, next_try_at=row.next_try_at, parked=bool(row.parked_at))

    def text(self) -> str:
        """One line: the error, and whether it is tried again or parked."""
        tries = f"{self.attempts} {'try' if self.attempts == 1 else 'tries'}"
        if self.parked:
            return f"parked after {tries}: {self.error}"
        return f"failed ({tries}, next at {self.next_try_at.astimezone():%Y-%m-%d %H:%M:%S}): {self.error}"


@dataclass(kw_only=True)
class Pass(Generic[K, R]):
    """What one pass over a job's keys did: each key done (its result), failed now (its error), or skipped
    (waiting out its backoff, or parked)."""

    done: dict[K, R] = field(default_factory=dict)
    failed: dict[K, str] = field(default_factory=dict)
    skipped: list[K] = field(default_factory=list)


def each(settings: Settings, job: str, keys: Iterable[K], work: Callable[[K], R]) -> Pass[K, R]:
    """`work(key)` for each key in order, each failure recorded on its key and the pass going on. A key whose
    fault waits for its next try, or is parked, is skipped. The database away or the broker lost is raised."""
    known = _waiting(settings, job)
    result: Pass[K, R] = Pass()
    for key in keys:
        name = str(key)
        if known.get(name):
            result.skipped.append(key)
            continue
        try:
            result.done[key] = work(key)
        except Exception as exc:
            if not_the_rows_fault(exc):
                raise
            result.failed[key] = record(settings, job, name, exc)
            continue
        if name in known:
            clear(settings, job, name)
    return result


def not_the_rows_fault(exc: BaseException) -> bool:
    """The database away (a restart, a failover) or the broker's connection lost: no row's fault."""
    return failover.is_away(exc) or isinstance(exc, LOST_CONNECTION)


def describe(exc: BaseException) -> str:
    """The failure in one line: a database error's own message, without the statement SQLAlchemy appends."""
    orig = exc.orig if isinstance(exc, sa.exc.DBAPIError) and exc.orig is not None else exc
    line = first_line(orig)
    return type(orig).__name__ if line == type(orig).__name__ else f"{type(orig).__name__}: {line}"


def retry_seconds(settings: Settings, attempts: int) -> float:
    """The wait after the `attempts`-th failure: MAS_ROW_RETRY_SECONDS doubling, at most an hour."""
    return min(MAX_RETRY_SECONDS, settings.reliability.row_retry_seconds * 2.0 ** min(attempts - 1, 20))


def record(settings: Settings, job: str, key: str, exc: BaseException) -> str:
    """Count a failure of `key`: its error, and its next try or, with its tries spent, parked. Its error."""
    error = visible(redact_text(describe(exc), settings.secret_values()))[:ERROR_CHARS]
    with session_scope(settings) as session:
        session.execute(
            pg_insert(RowFault)
            .values(job=job, key=key, error=error, attempts=0, next_try_at=sa.func.now())
            .on_conflict_do_nothing()
        )
        fault = session.get_one(RowFault, (job, key), with_for_update=True, populate_existing=True)
        fault.attempts, fault.error, fault.failed_at = fault.attempts + 1, error, sa.func.now()
        if fault.attempts >= settings.reliability.row_max_tries:
            fault.parked_at = sa.func.now()
            log.error("%s: %s parked after %d tries: %s", job, key, fault.attempts, error)
        else:
            wait = retry_seconds(settings, fault.attempts)
            fault.next_try_at = sa.func.now() + timedelta(seconds=wait)
            log.warning("%s: %s failed (try %d), again in %.0f s: %s", job, key, fault.attempts, wait, error)
    return error


def clear(settings: Settings, job: str, key: str) -> None:
    """`key` worked: it has no fault any more."""
    with session_scope(settings) as session:
        session.execute(sa.delete(RowFault).where(RowFault.job == job, RowFault.key == key))


def release(settings: Settings, job: str | None = None, key: str | None = None) -> list[tuple[str, str]]:
    """Forget the faults of `job`'s row `key` (every row of `job`; every job's without one), parked or not, once
    a person has seen to the row: the job's next run tries it again as a new row. The (job, key) released."""
    query = sa.delete(RowFault).returning(RowFault.job, RowFault.key)
    if job is not None:
        query = query.where(RowFault.job == job)
    if key is not None:
        query = query.where(RowFault.key == key)
    with session_scope(settings) as session:
        return sorted((j, k) for j, k in session.execute(query))


def faults(settings: Settings, job: str, keys: Iterable[object] | None = None) -> dict[str, Fault]:
    """The faults of `job`'s rows (of `keys` only, when given), by key."""
    query = sa.select(RowFault).where(RowFault.job == job)
    if keys is not None:
        query = query.where(RowFault.key.in_([str(key) for key in keys]))
    with session_scope(settings) as session:
        return {row.key: Fault.of(row) for row in session.scalars(query)}


def _waiting(settings: Settings, job: str) -> dict[str, bool]:
    """Every key of `job` with a fault: True for one to skip now (parked, or before its next try)."""
    waits = sa.or_(RowFault.parked_at.is_not(None), RowFault.next_try_at > sa.func.now())
    with session_scope(settings) as session:
        return {
            key: bool(wait) for key, wait in session.execute(sa.select(RowFault.key, waits).where(RowFault.job == job))
        }
