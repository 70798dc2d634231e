"""What a failover of a `Topology`'s database or broker cost the studio (`FIVE_HOSTS`).

`Topology.kill_primary` SIGKILLs the primary's whole process tree and, after an operator's detection delay,
promotes the standby (`pg_ctl promote`), measuring what the standby lacked: the LSN gap between the last WAL
position the primary was seen to have (`Watcher`) and the standby's replay position, the probe commits
acknowledged by the primary that the new primary lacks, and each video's attempt and state on the new primary,
against which `steps_lost` finds the steps committed on the old primary (each worker logs "<step> of video V
attempt A recorded" once its result is committed) whose result was lost: they must run again, once.
`ride` takes a batch through the faults asked for.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from mas.domain.steps import BY_STATE, STEPS, order
from mas.models import VideoState
from tests.harness.postgres_servers import PostgresServer

if TYPE_CHECKING:
    from tests.harness.topology import Topology

DETECT_S = 2.0  # an operator's (or a failover manager's) detection delay before promoting the standby


def lsn(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) + int(low, 16)


@dataclass
class Sample:
    """The primary as last seen before its death: its WAL insert position, the last probe commit it
    acknowledged and the position of that commit's insert (the commit record follows it)."""

    insert_lsn: int = 0
    probe: int = 0
    probe_lsn: int = 0


StepRun = tuple[int, int, str]  # video, attempt, step


@dataclass
class DatabaseFailover:
    """What a PostgreSQL failover took and lost."""

    killed_at: datetime
    promoting_at: datetime  # `pg_ctl promote` asked: until then no server took writes
    promoted_at: datetime  # the standby takes writes
    replay_lsn: int
    last_seen: Sample
    probes_lost: int
    kept: dict[int, tuple[int, str]] = field(default_factory=dict)  # video: (attempt, state) on the new primary

    def lacked(self, video: int, attempt: int, step: str) -> bool:
        """Whether the new primary started without this step's result (the video not past it)."""
        if video not in self.kept:
            return True
        kept_attempt, state = self.kept[video]
        if attempt != kept_attempt:
            return attempt > kept_attempt
        if state == VideoState.waiting.value:
            return True
        return state in STATES and order(VideoState(state)) <= order(BY_NAME[step].state)

    def steps_lost(self, recorded: dict[StepRun, list[datetime]]) -> set[StepRun]:
        """Steps committed on the old primary (recorded before the promotion was asked for: nothing else took
        writes; a step may be recorded on the new primary before `promoted_at`) whose result the new primary
        lacked."""
        return {run for run, times in recorded.items() if min(times) < self.promoting_at and self.lacked(*run)}

    @property
    def lsn_gap(self) -> int:
        """Bytes of WAL the primary had (last seen) that the standby had not replayed when promoted."""
        return max(0, self.last_seen.insert_lsn - self.replay_lsn)

    @property
    def acknowledged_kept(self) -> bool:
        """Whether the standby had replayed the last commit the primary acknowledged."""
        return self.replay_lsn >= self.last_seen.probe_lsn


BY_NAME = {step.name: step for step in STEPS}
STATES = {state.value for state in BY_STATE}


class Watcher(threading.Thread):
    """Writes probe commits to the primary (a table of the `postgres` database) and reads its WAL position,
    over and over, until the primary dies: `sample` is the primary as last seen."""

    def __init__(self, primary: PostgresServer) -> None:
        super().__init__(daemon=True)
        self.primary, self.sample, self.done = primary, Sample(), threading.Event()
        with primary._connect(primary.superuser_url) as conn:
            conn.execute("create table if not exists probes (n integer primary key)")

    def run(self) -> None:
        import psycopg

        try:
            with self.primary._connect(self.primary.superuser_url) as conn:
                n = 0
                while not self.done.is_set():
                    n += 1
                    with conn.transaction():
                        conn.execute("insert into probes values (%s)", (n,))
                        probe_lsn = lsn(conn.execute("select pg_current_wal_insert_lsn()::text").fetchone()[0])
                    insert_lsn = lsn(conn.execute("select pg_current_wal_insert_lsn()::text").fetchone()[0])
                    self.sample = Sample(insert_lsn, n, probe_lsn)
                    time.sleep(0.01)
        except psycopg.Error:
            return  # the primary died


@dataclass
class Ride:
    """One batch through the faults asked for: what each cost."""

    wall: float
    batch_id: int = 0
    database: DatabaseFailover | None = None
    moving: dict[str, float] = field(default_factory=dict)  # fault: seconds from the death to a step starting
    to_end: dict[str, float] = field(default_factory=dict)  # fault: seconds from the death to the batch's end
    renders: Counter[str] = field(default_factory=Counter)
    recorded: dict[StepRun, list[datetime]] = field(default_factory=dict)
    accepted: int = 0
    status: str = ""  # the batch's

    @property
    def lost(self) -> set[StepRun]:
        return self.database.steps_lost(self.recorded) if self.database else set()

    @property
    def again(self) -> set[StepRun]:
        """Steps whose result was committed more than once."""
        return {run for run, times in self.recorded.items() if len(times) > 1}


def ride(studio: Topology, total: int, *, primary: bool, master: bool, timeout: float = 300) -> Ride:
    """A batch of `total` videos; once 3 are accepted the primary is killed (and the standby promoted), two
    accepted videos later the Redis master (the Sentinels promote the replica), as asked."""
    started = time.monotonic()
    batch_id = studio.enqueue(total)
    deaths: dict[str, tuple[datetime, datetime]] = {}  # fault: (killed, failed over)
    database = None
    if primary:
        studio.wait_accepted(batch_id, 3)
        database = studio.kill_primary()
        deaths["primary"] = (database.killed_at, database.promoted_at)
    if master:
        studio.wait_accepted(batch_id, studio.accepted(batch_id) + 2 if primary else 3, timeout=120)
        deaths["master"] = studio.kill_master()
    studio.wait_accepted(batch_id, total, timeout=timeout)
    wall, end = time.monotonic() - started, datetime.now(UTC)
    result = Ride(wall=wall, batch_id=batch_id, database=database, renders=studio.renders(), recorded=studio.recorded(),
                  accepted=studio.accepted(batch_id),
                  status=studio.scalar("select status from batches where id = :b", b=batch_id))  # fmt: skip
    for fault, (killed, failed_over) in deaths.items():
        moving = studio.first_step_since(failed_over)  # nothing starts on a dead primary; a prefetched message may
        assert moving is not None  # start on a worker while the master is away: counted from its replacement
        result.moving[fault] = (moving - killed).total_seconds()
        result.to_end[fault] = (end - killed).total_seconds()
    return result
