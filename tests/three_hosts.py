"""A studio on three hosts, on real servers over TCP with passwords, and the faults to break it with.

Host A (this machine's root network namespace) runs Debian's redis-server (append-only), pgserver's
PostgreSQL 16 + pgvector with a login role that is not a superuser, a real S3-compatible server (SeaweedFS)
for the videos, the gpu worker and beat. Hosts B and C are network namespaces with a cpu worker each and no
shared filesystem (`tests/hosts.py`). Time is compressed: renders of 2 s and agent calls of 1 s, the lease,
keepalive and reconcile thresholds scaled down with them. Used by `tests/test_across_hosts.py` and
`bench/hosts_bench.py`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import sqlalchemy as sa

from tests.hosts import Host, Network, PostgresServer, RedisServer, S3Server, wait_for
from tests.studio import ROOT, Beat, CeleryWorker

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


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without its MAS_ settings, with the scaled thresholds."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAS_")}
    return {**env, "PYTHONPATH": str(ROOT), **SCALED, **extra}


class CpuHost:
    """A cpu worker on a host of its own (`-n cpu@NAME`); its log is written through a file handed to it."""

    def __init__(self, host: Host, env: dict[str, str], log_dir: Path) -> None:
        self.host, self.name = host, f"cpu@{host.name}"
        self.env = {**env, "MAS_DATA_DIR": str(host.root / "mas"), "HOME": str(host.root)}
        self.log = log_dir / f"cpu-{host.name}.log"
        argv = [sys.executable, "-m", "celery", "-A", "mas", "worker", "-Q", "cpu-urgent,cpu", "-n", self.name,
                "-P", "prefork", "-c", "2", "--prefetch-multiplier", "1", "-l", "INFO", "--without-gossip",
                "--without-mingle"]  # fmt: skip
        self.proc = host.popen(argv, env=self.env, cwd=ROOT, stdout=self.log.open("wb"), stderr=subprocess.STDOUT)
        wait_for(lambda: "ready." in self.log.read_text(), timeout=120, what=f"{self.name} ready")

    def mas(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.host.run([sys.executable, "-m", "mas.cli", *args], env=self.env, cwd=ROOT, timeout=120)


class ThreeHosts:
    """The servers and workers of the three hosts (a context manager: everything stops at its end)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self._stack = ExitStack()
        self.workers: list[CeleryWorker | Beat] = []
        self.outputs: list[str] = []  # what the `mas` commands printed, checked for secrets

    def __enter__(self) -> ThreeHosts:
        stack, tmp = self._stack.__enter__(), self.tmp
        try:
            self.net = stack.enter_context(Network(tmp / "hosts"))
            self.broker = stack.enter_context(RedisServer(tmp / "redis", address=self.net.gateway))
            self.pg = stack.enter_context(PostgresServer(tmp / "pg", address=self.net.gateway))
            self.s3 = stack.enter_context(S3Server(tmp / "s3", address=self.net.gateway))
            self.shared = clean_env(MAS_DATABASE_URL=self.pg.url, MAS_BROKER_URL=self.broker.url, **self.s3.env())
            self.env_a = {**self.shared, "MAS_DATA_DIR": str(tmp / "A")}
            self.engine = sa.create_engine(self.pg.url)
            stack.callback(self.engine.dispose)
            self.mas_a("up")
            self.b = CpuHost(self.net.host("B"), self.shared, tmp)
            self.c = CpuHost(self.net.host("C"), self.shared, tmp)
            stack.callback(self._stop_workers)
            self.gpu = self._gpu_worker()
            self.finished_at_kill: set[str] = set()  # renders that ended just as the gpu worker was killed
            beat = Beat(env=self.env_a, log_dir=tmp)
            self.workers.append(beat)
            beat.wait_ready()
        except BaseException:
            stack.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._stack.__exit__(*exc)

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

    def accepted(self, batch_id: int) -> int:
        with self.engine.connect() as conn:
            return conn.scalar(
                sa.text("select count(*) from videos where batch_id = :b and state = 'accepted'"), {"b": batch_id}
            )

    def wait_accepted(self, batch_id: int, count: int, *, timeout: float = 300) -> None:
        wait_for(lambda: self.accepted(batch_id) >= count, timeout=timeout, what=f"{count} videos accepted",
                 interval=0.2)  # fmt: skip

    def break_it(self, batch_id: int, total: int) -> dict[str, float]:
        """The three faults, one after the other; for each, seconds until the work it hit moved on."""
        recovery: dict[str, float] = {}

        # 1. Redis down for a while in the middle of the batch
        self.wait_accepted(batch_id, 2)
        self.broker.restart(down_seconds=REDIS_DOWN_S)
        back, since = time.monotonic(), self.accepted(batch_id)
        self.wait_accepted(batch_id, min(since + 1, total), timeout=120)
        recovery["redis restart"] = time.monotonic() - back

        # 2. host B cut off the network in the middle of a step, let back after CUT_S
        held: dict[int, tuple[str, int]] = {}
        wait_for(lambda: bool(held.update(self.held_by("cpu@B")) or held), timeout=60,
                 what="host B in the middle of a step", interval=0.05)  # fmt: skip
        self.b.host.cut()
        cut = time.monotonic()
        try:
            wait_for(lambda: all(self.moved(video, where) for video, where in held.items()), timeout=60,
                     what="the steps B held done elsewhere", interval=0.2)  # fmt: skip
        except TimeoutError as exc:  # what the studio saw of them, for whoever reads the failure
            raise TimeoutError(f"{exc}: held {held}; now {self.describe(held)}") from exc
        recovery["network cut"] = time.monotonic() - cut
        time.sleep(max(0.0, CUT_S - (time.monotonic() - cut)))  # the fault: B stays away CUT_S in all
        self.b.host.heal()

        # 3. the gpu worker SIGKILLed mid-render, started again under its name, then `mas recover`; counted from
        # the worker being back (how long a process takes to start is the machine's, not the studio's)
        wait_for(lambda: bool(self.held_by("gpu@A", step="render")), timeout=120, what="a render running",
                 interval=0.05)  # fmt: skip
        rendering = self.held_by("gpu@A", step="render")
        self.gpu.kill()
        # a render that reached its end just before the kill, its result not yet recorded, is done again
        ended = re.findall(r"render of (video \d+ attempt \d+) rendered in", self.gpu.log.read_text())
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

    def logs(self) -> list[Path]:
        return sorted({*(w.log for w in self.workers), self.b.log, self.c.log})

    def renders(self) -> Counter[str]:
        """Renders that ran to the end, per attempt ("video 3 attempt 1"), from the gpu workers' logs (a
        duplicate delivery that found the work done, and a killed render, did not render)."""
        return Counter(
            found.group(1) for log in self.logs() for line in log.read_text().splitlines()
            if (found := re.search(r"render of (video \d+ attempt \d+) rendered in", line))
        )  # fmt: skip
