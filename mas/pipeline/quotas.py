"""How much work one user may ask for: videos a day, videos waiting, batches at once.

Each quota is the user's own (`mas users set`, the `users` row) or else the studio's default (MAS_QUOTA_*);
unset is no limit. A new batch is counted against them in the transaction that stores it, under the user's
advisory lock (`names.quota_lock`): of two submits at once, the second counts the first's batch, so no two
submits pass on the same room. A batch beyond a quota is refused whole, nothing stored:

- `QuotaExceeded` (retryable) when the quota is full now: after `retry_after` seconds it may pass (for
  videos a day, when enough of the counted videos have left the 24-hour window; for videos waiting and batches
  at once, a fixed hint: work ends at its own pace).
- `LargerThanQuota` (permanent) when the request alone asks for more than a quota allows: it never passes.

What is counted:

- videos a day: the videos asked for by the user's batches made in the last 24 hours, whatever became of them
  (a cancelled batch's count too: the quota limits what is asked for), plus the new batch's;
- videos waiting: the user's videos not yet accepted, failed or cancelled, in batches not yet ended (a batch
  not yet planned counts the videos it asks for), plus the new batch's;
- batches at once: the user's batches queued, running or paused, plus the new one.

A schedule is counted when it runs, not when it is made (`production.run_due_schedules`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.orm import Session

from mas import locks, names
from mas.config import Settings
from mas.domain.identity import Actor
from mas.domain.states import TERMINAL, BatchStatus
from mas.errors import InvalidInput, RetryableError
from mas.models import Batch, User, Video

DAY = timedelta(hours=24)
"""The window of the videos-a-day quota."""

WAIT_HINT_SECONDS = 60
"""When to try again after the videos-waiting or batches-at-once quota refused a submit: a modest hint, since
the user's work ends at its own pace."""

NOT_ENDED = (BatchStatus.queued, BatchStatus.running, BatchStatus.paused)


@dataclass(frozen=True, kw_only=True)
class Quotas:
    """A user's quotas in force (None: no limit); the names are the `users` columns and the MAS_QUOTA_ settings."""

    videos_per_day: int | None = None
    videos_waiting: int | None = None
    batches_at_once: int | None = None


KINDS = tuple(f.name for f in fields(Quotas))


class QuotaExceeded(RetryableError):
    """A quota of the user is full now: nothing was stored, and the same submit may pass later, after
    `retry_after` seconds (None when that cannot be told)."""

    def __init__(self, message: str, *, retry_after: int | None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class LargerThanQuota(InvalidInput):
    """The request alone asks for more than a quota of its user allows: it never passes as it is; nothing was
    stored."""


def quotas_of(settings: Settings, session: Session, actor: Actor) -> Quotas:
    """`actor`'s quotas in force: their own where set (their `users` row), else the studio's defaults."""
    row = session.get(User, actor.user)
    own = {kind: getattr(row, kind) if row is not None else None for kind in KINDS}
    return Quotas(**{kind: own[kind] if own[kind] is not None else getattr(settings.quotas, kind) for kind in KINDS})


def check(settings: Settings, session: Session, actor: Actor, videos: int) -> None:
    """Refuse a new batch of `videos` videos for `actor` that would pass one of their quotas.

    With any quota set, the user's lock is taken in the session's transaction and held until it ends: the
    caller stores the batch in that same transaction, so the user's next submit counts it."""
    quotas, user = quotas_of(settings, session, actor), actor.user
    if quotas == Quotas():
        return
    locks.acquire(session.connection(), names.quota_lock(user))
    _refuse_what_never_fits(user, quotas, videos)
    now = session.execute(sa.select(sa.func.clock_timestamp())).scalar_one()
    full: list[tuple[str, int]] = []
    if quotas.batches_at_once is not None:
        at_once = session.scalar(
            sa.select(sa.func.count()).select_from(Batch).where(Batch.user_name == user, Batch.status.in_(NOT_ENDED))
        )
        if (at_once or 0) + 1 > quotas.batches_at_once:
            full.append((f"{at_once} batches not yet ended, of {quotas.batches_at_once} at once", WAIT_HINT_SECONDS))
    if quotas.videos_waiting is not None:
        waiting = _videos_waiting(session, user)
        if waiting + videos > quotas.videos_waiting:
            full.append(
                (
                    f"{waiting} videos waiting and {videos} more pass the {quotas.videos_waiting} allowed",
                    WAIT_HINT_SECONDS,
                )
            )
    if quotas.videos_per_day is not None:
        day = [
            (created_at, total)
            for created_at, total in session.execute(
                sa.select(Batch.created_at, Batch.total)
                .where(Batch.user_name == user, Batch.created_at > now - DAY)
                .order_by(Batch.created_at, Batch.id)
            )
        ]
        used = sum(total for _, total in day)
        if used + videos > quotas.videos_per_day:
            wait = _until_room(day, now, excess=used + videos - quotas.videos_per_day)
            full.append(
                (f"{used} videos in the last 24 h and {videos} more pass the {quotas.videos_per_day} a day", wait)
            )
    if full:
        retry_after = max(wait for _, wait in full)
        raise QuotaExceeded(
            f"{user}'s quota is full: {'; '.join(what for what, _ in full)}; nothing was queued; try again in "
            f"{_duration(retry_after)}",
            retry_after=retry_after,
        )


def _refuse_what_never_fits(user: str, quotas: Quotas, videos: int) -> None:
    if quotas.batches_at_once == 0:
        raise LargerThanQuota(f"{user}'s quota allows no batch at all (0 at once); nothing was queued")
    for limit, what in ((quotas.videos_per_day, "a day"), (quotas.videos_waiting, "waiting at once")):
        if limit is not None and videos > limit:
            raise LargerThanQuota(
                f"the request asks for {videos} videos and {user}'s quota allows {limit} {what}: it can never "
                f"pass; ask for fewer; nothing was queued"
            )


def _videos_waiting(session: Session, user: str) -> int:
    """The user's videos not yet ended, in batches not yet ended; a batch not yet planned counts its total."""
    planned = sa.exists().where(Video.batch_id == Batch.id)
    live = (
        sa.select(sa.func.count())
        .select_from(Video)
        .where(Video.batch_id == Batch.id, Video.state.not_in(list(TERMINAL)))
        .scalar_subquery()
    )
    return int(
        session.scalar(
            sa.select(sa.func.coalesce(sa.func.sum(sa.case((planned, live), else_=Batch.total)), 0)).where(
                Batch.user_name == user, Batch.status.in_(NOT_ENDED)
            )
        )
        or 0
    )


def _until_room(day: list[tuple[datetime, int]], now: datetime, *, excess: int) -> int:
    """Seconds until the oldest of the day's batches (made at, videos), in order, have left the 24-hour window
    with at least `excess` videos (there are that many: the request alone fits the quota)."""
    freed = 0
    for created_at, total in day:
        freed += total
        if freed >= excess:
            return max(1, math.ceil((created_at + DAY - now).total_seconds()))
    return max(1, math.ceil(DAY.total_seconds()))  # not reached: kept for a quota changed meanwhile


def _duration(seconds: int) -> str:
    if seconds < 120:
        return f"{seconds} s"
    minutes = math.ceil(seconds / 60)
    return f"{minutes} min" if minutes < 120 else f"{minutes // 60} h {minutes % 60} min"
