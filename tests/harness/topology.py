"""A studio spread over hosts and servers, and the faults to break it with.

`Topology(tmp, layout)` makes a `Network` on this machine and starts on it the servers a `Layout` places on hosts,
then the studio: a cpu worker on each of the layout's cpu hosts, the gpu worker and beat on host A (this
machine's root namespace, where a real S3 server, SeaweedFS, keeps the videos). Every server has a password;
no host shares a filesystem with another. Time is compressed (`SCALED`): renders of 2 s and agent calls of 1 s,
the lease, keepalive and reconcile thresholds scaled down with them; `env` lengthens them.

- `THREE_HOSTS`: Debian's redis-server (append-only) and pgserver's PostgreSQL 16 + pgvector (a login role
  that is no superuser) on A; cpu workers on B and C. `break_it` restarts Redis mid-batch, cuts host B off
  mid-step and lets it back, and kills the gpu worker mid-render.
- `FIVE_HOSTS`: the PostgreSQL primary and the Redis master on D, the streaming standby (pg_basebackup -R,
  `cluster_name=standby`; synchronous with `sync`) and the Redis replica on E, a Sentinel on each of D, E and
  A. Every studio process is given the multi-host MAS_DATABASE_URL (primary, then standby,
  target_session_attrs=read-write) and the sentinel:// broker URL. `kill_primary` and `kill_master` fail them
  over; `failover.ride` takes a batch through them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from mas.urls import sqlalchemy_database_url
from tests.harness.failover import DETECT_S, DatabaseFailover, StepRun, Watcher, lsn
from tests.harness.network import Host, Network
from tests.harness.postgres_servers import REPLICATION, STANDBY_NAME, PostgresServer, PostgresStandby, failover_url
from tests.harness.processes import wait_for
from tests.harness.redis_servers import RedisSentinels, RedisServer
from tests.harness.s3_server import S3Server
from tests.studio import ROOT, Beat, CeleryWorker, worker_argv

SCALED = {
    "MAS_PREVIEW_RENDER_SECONDS": "2",
    "MAS_OFFLINE_AGENT_SECONDS": "1",  # each write and review takes a second: a host can be cut mid-step
    "MAS_LEASE_HEARTBEAT_SECONDS": "0.5",
    "MAS_LEASE_EXPIRY_SECONDS": "2",
    "MAS_RECONCILE_EVERY_SECONDS": "1",
    "MAS_RECONCILE_AFTER_SECONDS": "3",
    "MAS_DATABASE_KEEPALIVE_SECONDS": "2",
    "MAS_MIN_ACCEPTABLE_GRADE": "F",  # the bar lowered: every video is accepted at its first attempt
}
REDIS_DOWN_S = 3
CUT_S = 5
_RENDERED = re.compile(r"render of (video \d+ attempt \d+) rendered in")
_RECORDED = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): .*?([a-z_]+) of video (\d+) attempt (\d+) recorded$"
)


@dataclass(frozen=True)
class Layout:
    """Which host runs which server: "A" is this machine's root namespace (its servers listen on the network's
    gateway), any other name a host of the network."""

    database: str = "A"
    standby: str | None = None  # a streaming standby of the database, on this host
    sync: bool = False  # with a standby: commits wait until it has flushed them
    broker: str = "A"  # Redis (with `replica`: its master)
    replica: str | None = None  # a Redis replica on this host, and a Sentinel on the master's, this and A
    cpu: tuple[str, ...] = ("B", "C")  # a cpu worker on each


THREE_HOSTS = Layout()
FIVE_HOSTS = Layout(database="D", standby="E", broker="D", replica="E")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without its MAS_ settings, with the scaled thresholds."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAS_")}
    return {**env, "PYTHONPATH": str(ROOT), **SCALED, **extra}


class CpuHost:
    """A cpu worker (2 processes) on a host of its own (`-n cpu@NAME`); its log is written through a file handed
    to it."""

    def __init__(self, host: Host, env: dict[str, str], log_dir: Path) -> None:
        self.host, self.name = host, f"cpu@{host.name}"
        self.env = {**env, "MAS_DATA_DIR": str(host.root / "mas"), "HOME": str(host.root)}
        self.log = log_dir / f"cpu-{host.name}.log"
        argv = [sys.executable, "-m", *worker_argv("cpu", self.name, env=self.env, concurrency=2)]
        self.proc = host.popen(argv, env=self.env, cwd=ROOT, stdout=self.log.open("wb"), stderr=subprocess.STDOUT)
        wait_for(lambda: "ready." in self.log.read_text(), timeout=120, what=f"{self.name} ready")

    def mas(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.host.run([sys.executable, "-m", "mas.cli", *args], env=self.env, cwd=ROOT, timeout=120)


class Topology:
    """The servers and workers of a `Layout` (a context manager: everything stops at its end)."""

    def __init__(self, tmp: Path, layout: Layout = THREE_HOSTS, *, env: dict[str, str] | None = None) -> None:
        self.tmp, self.layout = tmp, layout
        self.env = env or {}  # settings over the scaled ones, for every studio process (longer renders)
        self._stack = ExitStack()
        self.workers: list[CeleryWorker | Beat] = []
        self.outputs: list[str] = []  # what the `mas` commands printed, checked for secrets
        self.finished_at_kill: set[str] = set()  # renders that ended just as the gpu worker was killed
        self.standby: PostgresStandby | None = None

    def __enter__(self) -> Topology:
        stack, tmp, layout = self._stack.__enter__(), self.tmp, self.layout
        try:
            self.net = stack.enter_context(Network(tmp / "hosts"))
            self._servers(stack)
            self.shared = clean_env(MAS_DATABASE_URL=self.url, **self.broker.env(), **self.s3.env(), **self.env)
            self.env_a = {**self.shared, "MAS_DATA_DIR": str(tmp / "A")}
            self.engine = sa.create_engine(sqlalchemy_database_url(self.url), pool_pre_ping=True)
            stack.callback(self.engine.dispose)
            self.mas_a("up")
            stack.callback(self._stop_workers)
            self.cpu = {name: CpuHost(self.host(name), self.shared, tmp) for name in layout.cpu}
            self.gpu = self._gpu_worker()
            beat = Beat(env=self.env_a, log_dir=tmp)
            self.workers.append(beat)
            beat.wait_ready()
            if self.standby is not None:
                self.standby.caught_up()
                self.watcher = Watcher(self.database)
                self.watcher.start()
                stack.callback(self.watcher.done.set)
        except BaseException:
            stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.__exit__(*exc)

    def host(self, name: str) -> Host:
        """Host `name` of the network, made the first time it is asked for."""
        return self.net.hosts.get(name) or self.net.host(name)

    def _on(self, name: str) -> Host | None:
        return None if name == "A" else self.host(name)

    def _servers(self, stack: ExitStack) -> None:
        layout, tmp, gateway = self.layout, self.tmp, self.net.gateway
        if layout.standby is None:
            self.database = stack.enter_context(
                PostgresServer(tmp / "pg", address=gateway, host=self._on(layout.database))
            )
            self.url = self.database.url
        else:
            commits = f"synchronous_commit={'on' if layout.sync else 'off'}"
            self.database = stack.enter_context(PostgresServer(
                tmp / "pg", address=gateway, host=self._on(layout.database), settings=(commits, *REPLICATION)))  # fmt: skip
            self.standby = stack.enter_context(PostgresStandby(
                tmp / "pg-standby", self.database, host=self._on(layout.standby),
                settings=(f"cluster_name={STANDBY_NAME}", "synchronous_commit=off", *REPLICATION)))  # fmt: skip
            if layout.sync:
                self.database.wait_for_sync_standby()
            self.url = failover_url(self.database, self.standby)
        if layout.replica is None:
            self.broker: RedisServer | RedisSentinels = RedisServer(tmp / "redis", address=gateway,
                                                                    host=self._on(layout.broker))  # fmt: skip
        else:
            self.broker = RedisSentinels(tmp / "redis", address=gateway,
                                         hosts=(self._on(layout.broker), self._on(layout.replica)))  # fmt: skip
        stack.enter_context(self.broker)
        self.s3 = stack.enter_context(S3Server(tmp / "s3", address=gateway))

    @property
    def redis(self) -> RedisServer:
        """The one Redis server (a layout without a replica)."""
        assert isinstance(self.broker, RedisServer), "the layout's Redis has a replica: see `sentinels`"
        return self.broker

    @property
    def sentinels(self) -> RedisSentinels:
        """The Redis master, its replica and their Sentinels (a layout with a replica)."""
        assert isinstance(self.broker, RedisSentinels), "the layout's Redis has no replica"
        return self.broker

    @property
    def secrets(self) -> tuple[str, ...]:
        """Every password and key of the servers: none may be printed or logged."""
        sentinel = (self.broker.sentinel_password,) if isinstance(self.broker, RedisSentinels) else ()
        return (self.database.password, self.database.superuser_password, self.broker.password, *sentinel,
                self.s3.secret_key)  # fmt: skip

    def _stop_workers(self) -> None:
        for worker in self.workers:
            worker.stop()

    def _gpu_worker(self) -> CeleryWorker:
        gpu = CeleryWorker(kind="gpu", name="gpu@A", env=self.env_a, log_dir=self.tmp)
        self.workers.append(gpu)
        gpu.wait_ready()
        return gpu

    def mas_a(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`mas ...` on host A; a command that fails raises with its output."""
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
                 interval=0.2)  # fmt: skip

    def alive(self) -> dict[str, bool]:
        return {w.name: w.proc.poll() is None for w in self.workers} | {
            cpu.name: cpu.proc.poll() is None for cpu in self.cpu.values()
        }

    def logs(self) -> list[Path]:
        return sorted({*(w.log for w in self.workers), *(cpu.log for cpu in self.cpu.values())})

    def renders(self) -> Counter[str]:
        """Renders that ran to the end, per attempt ("video 3 attempt 1"), from the workers' own log lines (a
        duplicate delivery that found the work done, and a killed render, did not render)."""
        return Counter(
            found.group(1) for log in self.logs() for line in log.read_text().splitlines()
            if (found := _RENDERED.search(line))
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

    # --- THREE_HOSTS' faults ---------------------------------------------------------------------------------

    def break_it(self, batch_id: int, total: int) -> dict[str, float]:
        """The three faults, one after the other; for each, seconds until the work it hit moved on."""
        recovery: dict[str, float] = {}

        # 1. Redis down for a while in the middle of the batch
        self.wait_accepted(batch_id, 2)
        self.redis.restart(down_seconds=REDIS_DOWN_S)
        back, since = time.monotonic(), self.accepted(batch_id)
        self.wait_accepted(batch_id, min(since + 1, total), timeout=120)
        recovery["redis restart"] = time.monotonic() - back

        # 2. host B cut off the network in the middle of a step, let back after CUT_S
        held: dict[int, tuple[str, int]] = {}
        wait_for(lambda: bool(held.update(self.held_by("cpu@B")) or held), timeout=60,
                 what="host B in the middle of a step", interval=0.05)  # fmt: skip
        b = self.host("B")
        b.cut()
        cut = time.monotonic()
        try:
            wait_for(lambda: all(self.moved(video, where) for video, where in held.items()), timeout=60,
                     what="the steps B held done elsewhere", interval=0.2)  # fmt: skip
        except TimeoutError as exc:  # what the studio saw of them, for whoever reads the failure
            raise TimeoutError(f"{exc}: held {held}; now {self.describe(held)}") from exc
        recovery["network cut"] = time.monotonic() - cut
        time.sleep(max(0.0, CUT_S - (time.monotonic() - cut)))  # the fault: B stays away CUT_S in all
        b.heal()

        # 3. the gpu worker SIGKILLed mid-render, started again under its name, then `mas recover`; counted from
        # the worker being back (how long a process takes to start is the machine's, not the studio's)
        wait_for(lambda: bool(self.held_by("gpu@A", step="render")), timeout=120, what="a render running",
                 interval=0.05)  # fmt: skip
        rendering = self.held_by("gpu@A", step="render")
        self.gpu.kill()
        # a render that reached its end just before the kill, its result not yet recorded, is done again
        ended = _RENDERED.findall(self.gpu.log.read_text())
        self.finished_at_kill = {a for a in ended for v, (_, n) in rendering.items() if a == f"video {v} attempt {n}"}
        self.gpu = self._gpu_worker()
        back = time.monotonic()
        self.mas_a("recover")
        wait_for(lambda: all(self.moved(video, where) for video, where in rendering.items()), timeout=120,
                 what="the killed renders done again", interval=0.2)  # fmt: skip
        recovery["gpu worker killed, from its start again"] = time.monotonic() - back
        return recovery

    def held_by(self, worker: str, *, step: str | None = None) -> dict[int, tuple[str, int]]:
        """The videos whose step `worker` holds now, with their state and attempt."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.text(
                "select v.id, v.state, v.attempt_count from step_leases l join videos v on v.id = l.video_id "
                "where l.token is not null and split_part(l.worker, '/', 1) = :w and (cast(:s as text) is null or l.step = :s)"),
                {"w": worker, "s": step}).all()  # fmt: skip
        return {row.id: (row.state, row.attempt_count) for row in rows}

    def describe(self, videos: dict[int, tuple[str, int]]) -> list[dict]:
        """The videos' rows and their leases, as the database has them now."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.text(
                "select v.id, v.state, v.attempt_count, v.updated_at, l.step, l.worker, l.token is not null as held, "
                "l.heartbeat_at, now() as now from videos v left join step_leases l on l.video_id = v.id "
                "where v.id = any(:ids)"), {"ids": list(videos)}).mappings().all()  # fmt: skip
        return [dict(row) for row in rows]

    def moved(self, video_id: int, where: tuple[str, int]) -> bool:
        with self.engine.connect() as conn:
            row = conn.execute(sa.text("select state, attempt_count from videos where id = :v"), {"v": video_id}).one()
        return (row.state, row.attempt_count) != where

    # --- FIVE_HOSTS' faults ----------------------------------------------------------------------------------

    def kill_primary(self) -> DatabaseFailover:
        """SIGKILL the primary, wait the detection delay, promote the standby; what the standby lacked."""
        standby = self.standby
        assert standby is not None, "the layout has no standby"
        self.database.crash()
        killed = datetime.now(UTC)
        self.watcher.join(10)
        last = self.watcher.sample
        time.sleep(DETECT_S)

        replayed: list[str] = []

        def settled() -> bool:  # the standby replayed all it will (a record cut short by the death never is)
            replayed.append(standby.scalar("select pg_last_wal_replay_lsn()::text"))
            return len(replayed) > 5 and len(set(replayed[-6:])) == 1

        wait_for(settled, timeout=30, what="the standby to replay what it received", interval=0.2)
        studio = standby.superuser_url.rsplit("/", 1)[0] + "/studio"
        with standby._connect(studio) as conn:  # what the new primary will start from
            kept = {row[0]: (row[1], row[2]) for row in conn.execute("select id, attempt_count, state from videos")}
        probes = int(standby.scalar("select coalesce(max(n), 0) from probes"))
        promoting = datetime.now(UTC)
        standby.promote()
        replay = lsn(standby.scalar("select pg_last_wal_replay_lsn()::text"))  # static once promoted
        return DatabaseFailover(
            killed_at=killed, promoting_at=promoting, promoted_at=datetime.now(UTC), replay_lsn=replay, last_seen=last,
            probes_lost=max(0, last.probe - probes), kept=kept,
        )  # fmt: skip

    def kill_master(self) -> tuple[datetime, datetime]:
        """SIGKILL the Redis master and wait until the Sentinels name the replica; (killed, failed over)."""
        old = self.sentinels.master_address()
        assert old is not None
        self.sentinels.server_at(old).crash()
        killed = datetime.now(UTC)
        self.sentinels.wait_for_failover(old)
        return killed, datetime.now(UTC)

    def first_step_since(self, moment: datetime) -> datetime | None:
        """When the first step started (its lease claimed) at or after `moment`."""
        return self.scalar("select min(started_at) from step_leases where started_at >= :m", m=moment)
