"""A studio spread over five hosts whose database and broker fail over, and what a failover cost it.

Host D runs the PostgreSQL primary, the Redis master and a Sentinel; host E the streaming standby
(pg_basebackup -R, `cluster_name=standby`), the Redis replica and a Sentinel; host A (this machine's root
namespace) a third Sentinel, the S3 server, the gpu worker and beat; hosts B and C a cpu worker each (network
namespaces, `tests/hosts.py`). Every studio process is given the multi-host MAS_DATABASE_URL (primary, then
standby, target_session_attrs=read-write) and the sentinel:// broker URL. Time is compressed as in
`tests/three_hosts.py` (2 s renders, 1 s agent calls).

Replication is asynchronous, or synchronous (`synchronous_standby_names = 'standby'` and
`synchronous_commit = on` on the primary). `kill_primary` SIGKILLs the primary's whole process tree and, after an
operator's detection delay, promotes the standby (`pg_ctl promote`), measuring what the standby lacked: the LSN
gap between the last WAL position the primary was seen to have and the standby's replay position, the probe
commits acknowledged by the primary that the new primary lacks, and each video's attempt and state on the new
primary, against which `steps_lost` finds the steps committed on the old primary (each worker logs "<step> of
video V attempt A recorded" once its result is committed) whose result was lost: they must run again, once.
`kill_master` SIGKILLs the Redis master and waits for the Sentinels to promote the replica. Used by `tests/test_failover_hosts.py` and
`bench/failover_bench.py`.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from mas.domain.steps import BY_STATE, STEPS, order
from mas.models import VideoState
from mas.urls import sqlalchemy_database_url
from tests.hosted_servers import STANDBY_NAME, HostedPrimary, HostedStandby, SpreadSentinels, crash
from tests.hosts import Network, PostgresServer, S3Server, wait_for
from tests.replicas import failover_url
from tests.studio import Beat, CeleryWorker
from tests.three_hosts import CpuHost, clean_env

DETECT_S = 2.0  # an operator's (or a failover manager's) detection delay before promoting the standby


def _lsn(text: str) -> int:
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
    promoted_at: datetime
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
        """Steps committed on the old primary (recorded before the promotion: nothing else took writes) whose
        result the new primary lacked."""
        return {run for run, times in recorded.items() if min(times) < self.promoted_at and self.lacked(*run)}

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
_RECORDED = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): .*?([a-z_]+) of video (\d+) attempt (\d+) recorded$"
)


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
                        probe_lsn = _lsn(conn.execute("select pg_current_wal_insert_lsn()::text").fetchone()[0])
                    insert_lsn = _lsn(conn.execute("select pg_current_wal_insert_lsn()::text").fetchone()[0])
                    self.sample = Sample(insert_lsn, n, probe_lsn)
                    time.sleep(0.01)
        except psycopg.Error:
            return  # the primary died


class FailoverHosts:
    """The studio of the module's docstring (a context manager: everything stops at its end)."""

    def __init__(self, tmp: Path, *, sync: bool) -> None:
        self.tmp, self.sync = tmp, sync
        self._stack = ExitStack()
        self.workers: list[CeleryWorker | Beat] = []
        self.outputs: list[str] = []

    def __enter__(self) -> FailoverHosts:
        stack, tmp = self._stack.__enter__(), self.tmp
        try:
            self.net = stack.enter_context(Network(tmp / "hosts"))
            self.d, self.e = self.net.host("D"), self.net.host("E")
            self.primary = stack.enter_context(HostedPrimary(tmp / "pg-d", self.d, sync=self.sync))
            self.standby = stack.enter_context(HostedStandby(tmp / "pg-e", self.primary, self.e))
            if self.sync:
                self.primary.wait_for_sync_standby()
            self.redis = stack.enter_context(SpreadSentinels(tmp / "redis", self.d, self.e, self.net.gateway))
            self.s3 = stack.enter_context(S3Server(tmp / "s3", address=self.net.gateway))
            self.url = failover_url(self.primary, self.standby)
            self.shared = clean_env(MAS_DATABASE_URL=self.url, **self.redis.env(), **self.s3.env())
            self.env_a = {**self.shared, "MAS_DATA_DIR": str(tmp / "A")}
            self.engine = sa.create_engine(sqlalchemy_database_url(self.url), pool_pre_ping=True)
            stack.callback(self.engine.dispose)
            self.mas_a("up")
            stack.callback(self._stop_workers)
            self.b = CpuHost(self.net.host("B"), self.shared, tmp)
            self.c = CpuHost(self.net.host("C"), self.shared, tmp)
            self.gpu = CeleryWorker(kind="gpu", name="gpu@A", env=self.env_a, log_dir=tmp)
            self.workers.append(self.gpu)
            self.gpu.wait_ready()
            beat = Beat(env=self.env_a, log_dir=tmp)
            self.workers.append(beat)
            beat.wait_ready()
            self.standby.caught_up()
            self.watcher = Watcher(self.primary)
            self.watcher.start()
            stack.callback(self.watcher.done.set)
        except BaseException:
            stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.__exit__(*exc)

    def _stop_workers(self) -> None:
        for worker in self.workers:
            worker.stop()

    @property
    def secrets(self) -> tuple[str, ...]:
        return (self.primary.password, self.primary.superuser_password, self.redis.password,
                self.redis.sentinel_password, self.s3.secret_key)  # fmt: skip

    def mas_a(self, *args: str) -> subprocess.CompletedProcess[str]:
        from tests.studio import ROOT

        done = subprocess.run([sys.executable, "-m", "mas.cli", *args], env=self.env_a, cwd=ROOT,
                              capture_output=True, text=True, timeout=180)  # fmt: skip
        self.outputs.append(done.stdout + done.stderr)
        if done.returncode != 0:
            raise RuntimeError(f"mas {' '.join(args)} failed: {done.stdout}{done.stderr}")
        return done

    def enqueue(self, total: int) -> int:
        return int(self.mas_a("enqueue", f"Create {total} videos of lighthouses").stdout.split()[1].rstrip(":"))

    def scalar(self, query: str, **params: Any) -> Any:
        """A value read from the primary of now (retried through a failover)."""
        found: list[Any] = []

        def read() -> bool:
            try:
                with self.engine.connect() as conn:
                    found.append(conn.scalar(sa.text(query), params))
                return True
            except sa.exc.OperationalError:
                return False

        wait_for(read, timeout=120, what="the database to answer", interval=0.2)
        return found[-1]

    def accepted(self, batch_id: int) -> int:
        return int(self.scalar("select count(*) from videos where batch_id = :b and state = 'accepted'", b=batch_id))

    def wait_accepted(self, batch_id: int, count: int, *, timeout: float = 300) -> None:
        wait_for(lambda: self.accepted(batch_id) >= count, timeout=timeout, what=f"{count} videos accepted",
                 interval=0.3)  # fmt: skip

    def replication_state(self) -> str | None:
        with self.primary._connect(self.primary.superuser_url) as conn:
            row = conn.execute("select sync_state from pg_stat_replication where application_name = %s",
                               (STANDBY_NAME,)).fetchone()  # fmt: skip
        return None if row is None else str(row[0])

    def kill_primary(self) -> DatabaseFailover:
        """SIGKILL the primary, wait the detection delay, promote the standby; what the standby lacked."""
        crash(self.primary.process)
        killed = datetime.now(UTC)
        self.watcher.join(10)
        last = self.watcher.sample
        time.sleep(DETECT_S)
        standby = self.standby

        replayed: list[str] = []

        def settled() -> bool:  # the standby replayed all it will (a record cut short by the death never is)
            replayed.append(standby._sql(standby, "select pg_last_wal_replay_lsn()::text"))
            return len(replayed) > 5 and len(set(replayed[-6:])) == 1

        wait_for(settled, timeout=30, what="the standby to replay what it received", interval=0.2)
        studio = standby.superuser_url.rsplit("/", 1)[0] + "/studio"
        with standby._connect(studio) as conn:  # what the new primary will start from
            kept = {row[0]: (row[1], row[2]) for row in conn.execute("select id, attempt_count, state from videos")}
        probes = int(standby._sql(standby, "select coalesce(max(n), 0) from probes"))
        standby.promote()
        replay = _lsn(standby._sql(standby, "select pg_last_wal_replay_lsn()::text"))  # static once promoted
        return DatabaseFailover(
            killed_at=killed, promoted_at=datetime.now(UTC), replay_lsn=replay, last_seen=last,
            probes_lost=max(0, last.probe - probes), kept=kept,
        )  # fmt: skip

    def kill_master(self) -> tuple[datetime, datetime]:
        """SIGKILL the Redis master and wait until the Sentinels name the replica; (killed, failed over)."""
        old = self.redis.master_address()
        assert old is not None
        crash(self.redis.server_at(old).process)
        killed = datetime.now(UTC)
        self.redis.wait_for_failover(old)
        return killed, datetime.now(UTC)

    def first_step_since(self, moment: datetime) -> datetime | None:
        """When the first step started (its lease claimed) at or after `moment`."""
        return self.scalar("select min(started_at) from step_leases where started_at >= :m", m=moment)

    def logs(self) -> list[Path]:
        return sorted({*(w.log for w in self.workers), self.b.log, self.c.log})

    def renders(self) -> Counter[str]:
        """Renders that ran to the end, per attempt ("video 3 attempt 1"), from the workers' own log lines."""
        return Counter(
            found.group(1) for log in self.logs() for line in log.read_text().splitlines()
            if (found := re.search(r"render of (video \d+ attempt \d+) rendered in", line))
        )  # fmt: skip

    def recorded(self) -> dict[StepRun, list[datetime]]:
        """When each step's result was committed, per run of it, from the workers' "recorded" log lines."""
        found: dict[StepRun, list[datetime]] = {}
        for log in self.logs():
            for line in log.read_text().splitlines():
                if match := _RECORDED.match(line):
                    when = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").astimezone(UTC)
                    run = (int(match.group(3)), int(match.group(4)), match.group(2))
                    found.setdefault(run, []).append(when)
        return found

    def alive(self) -> dict[str, bool]:
        return {w.name: w.proc.poll() is None for w in self.workers} | {
            host.name: host.proc.poll() is None for host in (self.b, self.c)
        }


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


def ride(studio: FailoverHosts, total: int, *, primary: bool, master: bool, timeout: float = 300) -> Ride:
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
