"""Step leases: which delivery of a step is running it, and whether it is still alive.

A step (`mas.domain.steps`) of one attempt of one video claims a lease row before it does its
work: a fresh token, a start time and a heartbeat that a thread of the running process renews. A second
delivery of the same step (redelivery while a render is slow, `mas resume` or `mas recover` on a running
batch, a second gpu worker) finds the live lease and leaves the work alone. A lease whose heartbeat stopped
(its worker was killed, the machine went away) is dead: the next delivery takes it over, and it is what
"lost" means to reconcile. A lease names its holder (`nodename/pid`): a worker started again under the same
name takes over at once the leases of its predecessor's processes, which are gone (`take_over_predecessors`),
and `mas recover` those of workers that no longer answer (`expire_unanswered`). Each take-over counts a claim; a step claimed more often than
`MAS_MAX_DELIVERIES` keeps killing its worker and is given up (a step's deliveries are counted here only).
A lease that could not be released because the database was away (a failover) is remembered by its process,
which takes it back when the step comes again (its retry) and releases it once the database answers.

Postgres holds the leases, so they survive a broker that lost its data and are shared by every worker.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from celery.exceptions import Ignore

from mas.config import Settings
from mas.db import ready_engine
from mas.domain.states import TERMINAL
from mas.errors import PermanentError, RetryableError
from mas.runtime.failover import DATABASE_AWAY
from mas.singletons import per_process

log = logging.getLogger(__name__)


LATE_BEATS = 2
"""A heartbeat this many beats late says its holder stopped (killed, cut off): shown as waiting on recovery,
and taken over by `mas recover` when its worker does not answer either."""

KEY_CHARS = 12
"""Length of `Lease.key` (hex digits of the claim's token)."""


class LeaseHeld(RetryableError):
    """A retried step found its lease held, maybe by its own earlier try that could not release it."""


class StepGivenUp(PermanentError):
    """The step was claimed more often than allowed: whatever runs it kills its worker."""


@dataclass(frozen=True, kw_only=True)
class Lease:
    video_id: int
    attempt: int
    step: str
    token: str
    claims: int

    @property
    def key(self) -> str:
        """Unique per claim: temporary files of this run carry it, so two runs never share one."""
        return self.token[:KEY_CHARS]


_CLAIM = sa.text("""
    insert into step_leases (video_id, attempt, step, token, worker, claims, started_at, heartbeat_at)
    values (:video_id, :attempt, :step, :token, :worker, 1, now(), now())
    on conflict (video_id, attempt, step) do update
       set token = excluded.token, worker = excluded.worker,
           claims = step_leases.claims + (step_leases.token is distinct from cast(:own as text)
                                          and step_leases.token is not null)::int,
           started_at = now(), heartbeat_at = now()
     where step_leases.token is null
        or step_leases.token = cast(:own as text)
        or step_leases.heartbeat_at < now() - make_interval(secs => :expiry)
    returning claims
""")


class Unreleased:
    """The leases this process ended but could not release (the database was away): no delivery runs their
    steps, so this process's next claim of one takes it back at once instead of waiting out its expiry, and a
    thread releases each once the database answers."""

    def __init__(self) -> None:
        self._tokens: dict[tuple[int, int, str], str] = {}
        self._lock = threading.Lock()

    def keep(self, lease: Lease) -> None:
        with self._lock:
            self._tokens[_slot(lease)] = lease.token

    def token(self, video_id: int, attempt: int, step: str) -> str | None:
        with self._lock:
            return self._tokens.get((video_id, attempt, step))

    def holds(self, lease: Lease) -> bool:
        return self.token(lease.video_id, lease.attempt, lease.step) == lease.token

    def drop(self, video_id: int, attempt: int, step: str, token: str | None) -> None:
        with self._lock:
            if token is not None and self._tokens.get((video_id, attempt, step)) == token:
                del self._tokens[(video_id, attempt, step)]


@per_process(key=lambda: "unreleased")
def unreleased() -> Unreleased:
    """This process's `Unreleased` (a forked child starts with none: its parent's leases are not its own)."""
    return Unreleased()


def _slot(lease: Lease) -> tuple[int, int, str]:
    return lease.video_id, lease.attempt, lease.step


def claim(settings: Settings, *, video_id: int, attempt: int, step: str, worker: str) -> Lease | None:
    """The lease of this step, or None when another delivery holds a live one (leave the work to it).
    `worker` is the Celery node name of the claiming worker (`holder` adds this process's id). A lease this
    process could not release (`Unreleased`) is taken back, and not counted as a holder that died."""
    token = uuid.uuid4().hex
    own = unreleased().token(video_id, attempt, step)
    with ready_engine(settings).begin() as conn:
        claims = conn.execute(
            _CLAIM,
            {
                "video_id": video_id,
                "attempt": attempt,
                "step": step,
                "token": token,
                "own": own,
                "worker": holder(worker),
                "expiry": settings.reliability.lease_expiry_seconds,
            },
        ).scalar_one_or_none()
    if claims is None:
        return None
    if own is not None:
        unreleased().drop(video_id, attempt, step, own)  # taken back, or released by its thread meanwhile
        log.info("%s of video %s attempt %s: its lease taken back by this worker", step, video_id, attempt)
    return Lease(video_id=video_id, attempt=attempt, step=step, token=token, claims=claims)


def renew(settings: Settings, lease: Lease) -> bool:
    """Beat the lease's heart; False when it was taken over (its heartbeat had stopped for too long)."""
    with ready_engine(settings).begin() as conn:
        return (
            conn.execute(
                sa.text(
                    "update step_leases set heartbeat_at = now() "
                    "where video_id = :v and attempt = :a and step = :s and token = :t"
                ),
                {"v": lease.video_id, "a": lease.attempt, "s": lease.step, "t": lease.token},
            ).rowcount
            == 1
        )


def release(settings: Settings, lease: Lease) -> None:
    """End the lease (the step finished or failed); its claim count stays for the record."""
    with ready_engine(settings).begin() as conn:
        conn.execute(
            sa.text(
                "update step_leases set token = null, heartbeat_at = now() "
                "where video_id = :v and attempt = :a and step = :s and token = :t"
            ),
            {"v": lease.video_id, "a": lease.attempt, "s": lease.step, "t": lease.token},
        )


def running(settings: Settings) -> set[int]:
    """Videos with a live lease now: a step is running them (whatever the broker says)."""
    return _videos(settings, "heartbeat_at >= now() - make_interval(secs => :expiry)")


def dead(settings: Settings) -> set[int]:
    """Videos with a dead lease: a step started and its heartbeat stopped (its worker is gone)."""
    return _videos(settings, "heartbeat_at < now() - make_interval(secs => :expiry)")


def end_dead_of_final(settings: Settings) -> set[int]:
    """End the dead leases of videos that are final: nothing delivers their step again to release them (an
    acknowledged release lost with a database failover's unreplicated commits). Returns their videos."""
    with ready_engine(settings).begin() as conn:
        return set(
            conn.execute(
                sa.text(
                    "update step_leases l set token = null from videos v where v.id = l.video_id "
                    "and l.token is not null and l.heartbeat_at < now() - make_interval(secs => :expiry) "
                    "and v.state = any(:final) returning l.video_id"
                ),
                {"expiry": settings.reliability.lease_expiry_seconds, "final": [s.name for s in TERMINAL]},
            ).scalars()
        )


@dataclass(frozen=True, kw_only=True)
class Holding:
    """A step that a delivery holds now."""

    video_id: int
    step: str
    worker: str
    """The holding worker's node name."""
    beating: bool
    """Its heartbeat is on time (False: it missed beats; once past the expiry the step is re-sent)."""


def holdings(settings: Settings) -> list[Holding]:
    """Every held step, on time or not: for `mas status` (a video waiting on recovery) and `mas recover`."""
    with ready_engine(settings).begin() as conn:
        rows = conn.execute(
            sa.text(
                "select video_id, step, worker, heartbeat_at >= now() - make_interval(secs => :late) as beating "
                "from step_leases where token is not null order by video_id"
            ),
            {"late": LATE_BEATS * settings.reliability.lease_heartbeat_seconds},
        ).all()
    return [
        Holding(video_id=r.video_id, step=r.step, worker=r.worker.split("/", 1)[0], beating=r.beating) for r in rows
    ]


def live_keys(settings: Settings) -> set[str]:
    """The `Lease.key` of every live lease: a temporary file carrying another key belongs to no running step."""
    with ready_engine(settings).begin() as conn:
        tokens = conn.execute(
            sa.text(
                "select token from step_leases where token is not null "
                "and heartbeat_at >= now() - make_interval(secs => :expiry)"
            ),
            {"expiry": settings.reliability.lease_expiry_seconds},
        ).scalars()
        return {token[:KEY_CHARS] for token in tokens}


def last_activity(settings: Settings) -> dict[int, Any]:
    """Per video, when a step of it last showed life (claimed, renewed or released its lease)."""
    with ready_engine(settings).begin() as conn:
        return dict(
            conn.execute(sa.text("select video_id, max(heartbeat_at) from step_leases group by video_id")).all()
        )


def _videos(settings: Settings, condition: str) -> set[int]:
    with ready_engine(settings).begin() as conn:
        return set(
            conn.execute(
                sa.text(f"select distinct video_id from step_leases where token is not null and {condition}"),
                {"expiry": settings.reliability.lease_expiry_seconds},
            ).scalars()
        )


def take_over_predecessors(settings: Settings, nodename: str) -> set[int]:
    """At a worker's start: end the live leases its own name holds from processes that are gone (the same
    worker killed and started again), so their steps are re-sent now rather than when their heartbeat
    expires. Returns their videos. A node name is one worker on one machine, so its holders' process ids
    are this machine's."""
    return _end_held(
        settings,
        where="split_part(worker, '/', 1) = :node",
        params={"node": nodename},
        gone=lambda worker: not _process_alive(worker),
    )


def expire_unanswered(settings: Settings, answering: set[str]) -> set[int]:
    """End the live leases whose worker did not answer (`answering`: the node names that did) and whose
    heartbeat is late (as `holdings` says): that worker is gone or cut off. For `mas recover`: a person asks
    for the work to be taken over now; a worker that is alive and answering keeps its leases."""
    return _end_held(
        settings,
        where="heartbeat_at < now() - make_interval(secs => :late)",
        params={"late": LATE_BEATS * settings.reliability.lease_heartbeat_seconds},
        gone=lambda worker: worker.split("/", 1)[0] not in answering,
    )


def _end_held(settings: Settings, *, where: str, params: dict[str, Any], gone: Callable[[str], bool]) -> set[int]:
    """Date back past the expiry the heartbeat of each held lease matching `where` whose holder is `gone`:
    the lease is dead, as if its holder had stopped beating. Returns their videos."""
    with ready_engine(settings).begin() as conn:
        rows = conn.execute(
            sa.text(f"select video_id, attempt, step, worker from step_leases where token is not null and {where}"),
            params,
        ).all()
        ended = [row for row in rows if gone(row.worker)]
        for row in ended:
            conn.execute(
                sa.text(
                    "update step_leases set heartbeat_at = now() - make_interval(secs => :expiry + 1) "
                    "where video_id = :v and attempt = :a and step = :s and token is not null"
                ),
                {
                    "v": row.video_id,
                    "a": row.attempt,
                    "s": row.step,
                    "expiry": settings.reliability.lease_expiry_seconds,
                },
            )
    return {row.video_id for row in ended}


def _process_alive(worker: str) -> bool:
    _, _, pid = worker.rpartition("/")
    if not pid.isdigit():
        return True  # not a holder this module wrote: leave it to the expiry
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def held(settings: Settings, *, video_id: int, attempt: int, step: str, worker: str) -> Iterator[Lease | None]:
    """Claim the step for the block and keep its heartbeat going; yields None when another delivery runs
    it."""
    lease = claim(settings, video_id=video_id, attempt=attempt, step=step, worker=worker)
    if lease is None:
        yield None
        return
    try:
        with _heartbeat(settings, lease):
            yield lease
    finally:
        _let_go(settings, lease)


def _let_go(settings: Settings, lease: Lease) -> None:
    """Release the lease; when the database is away, keep it in `unreleased` (this process's next claim of the
    step takes it back) and release it from a thread once the database answers, until it would have expired."""
    try:
        release(settings, lease)
        return
    except DATABASE_AWAY as exc:
        log.warning(
            "%s of video %s attempt %s: lease not released yet: %s", lease.step, lease.video_id, lease.attempt, exc
        )
    unreleased().keep(lease)
    threading.Thread(
        target=_release_when_answered,
        args=(settings, lease),
        name=f"release-{lease.step}-{lease.video_id}",
        daemon=True,
    ).start()


def _release_when_answered(settings: Settings, lease: Lease) -> None:
    mine = unreleased()
    deadline = time.monotonic() + settings.reliability.lease_expiry_seconds  # then it is dead: anyone takes it
    pause = 0.25
    try:
        while mine.holds(lease) and time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(2 * pause, 2.0)
            try:
                release(settings, lease)
                return
            except DATABASE_AWAY:
                continue
    finally:
        mine.drop(lease.video_id, lease.attempt, lease.step, lease.token)


def check_claims(settings: Settings, lease: Lease) -> None:
    """Give the step up (`StepGivenUp`) when it was taken over from a dead holder more than
    `MAS_MAX_DELIVERIES` times in all: whatever runs it kills its worker. A delivery that ended normally (a
    retry, a duplicate) does not count; only a lease whose holder died does."""
    if lease.claims > settings.reliability.max_deliveries:
        raise StepGivenUp(
            f"{lease.step} of video {lease.video_id} attempt {lease.attempt} started {lease.claims} times without "
            "finishing (its worker kept dying)"
        )


@contextmanager
def hold_step(
    settings: Settings, *, video_id: int, attempt: int, step: str, worker: str, retrying: bool = False
) -> Iterator[Lease]:
    """For a task body: hold the step's lease, or end the task quietly (Celery's `Ignore`: no error, no next
    step) when another delivery is running the same step. A retry (`retrying`) that finds the lease held may
    be finding its own earlier try's, which could not release it (the database was away): in the same process
    it is taken back at once (`Unreleased`); elsewhere it raises `LeaseHeld`, to be tried again once that lease
    is released or has expired."""
    with held(settings, video_id=video_id, attempt=attempt, step=step, worker=worker) as lease:
        if lease is None:
            if retrying:
                raise LeaseHeld(f"{step} of video {video_id} attempt {attempt} is held; trying again once it expires")
            log.info("%s of video %s attempt %s is running elsewhere; leaving it alone", step, video_id, attempt)
            raise Ignore()
        yield lease


@contextmanager
def _heartbeat(settings: Settings, lease: Lease) -> Iterator[None]:
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(settings.reliability.lease_heartbeat_seconds):
            try:
                if not renew(settings, lease):
                    log.error(
                        "lease of %s video %s attempt %s was taken over", lease.step, lease.video_id, lease.attempt
                    )
                    return
            except Exception as exc:  # the database is briefly away: keep trying until it answers
                log.warning("lease heartbeat failed: %s", exc)

    thread = threading.Thread(target=beat, name=f"lease-{lease.step}-{lease.video_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def holder(nodename: str | None) -> str:
    """What a lease records of its holder: the worker's node name (this host's name outside a worker) and
    this process's id."""
    return f"{nodename or socket.gethostname()}/{os.getpid()}"
