"""An isolated studio for tests that break things: its own data dir, services and worker processes.

Everything talks to it the way a user would: `mas` commands in subprocesses with its environment, real
Celery workers in their own process groups (so a test can SIGKILL a whole worker), and Postgres read
directly for assertions.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from unittest import mock

import sqlalchemy as sa

from mas import db, names
from mas.config import Settings
from mas.models import Batch, BatchStatus, StepLease, Video
from mas.pipeline import leases
from mas.runtime import services
from mas.runtime.app import app_for, queue_keys
from mas.runtime.clients import redis_client
from tests.harness.processes import wait_for

ROOT = Path(__file__).resolve().parents[1]


class CeleryProcess:
    """A real Celery process (a worker or beat) in its own process group, logging to a file.

    Its own process group lets a test SIGKILL it and its pool children at once; its log is read for
    readiness (`ready_line`) and for what it ran.
    """

    ready_line = "ready."

    def __init__(self, *, args: Sequence[str], name: str, env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.log = log_dir / f"{name.split('@')[0]}-{int(time.time() * 1000)}.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", *args],
            env=env,
            cwd=ROOT,
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited:\n{self.log.read_text()[-3000:]}")
            if self.ready_line in self.log.read_text():
                return
            time.sleep(0.2)
        raise TimeoutError(f"{self.name} not ready:\n{self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL the process and its children at once, as a crash or an OOM kill would."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout: float = 20) -> None:
        """Warm shutdown: a worker finishes its running task and gives reserved ones back."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()


def worker_argv(kind: str, name: str, *, env: dict[str, str], concurrency: int = 1) -> list[str]:
    """`python -m` arguments that start a Celery worker with the flags `mas worker --queue KIND` gives it."""
    from mas.config import GpuSettings
    from mas.names import WORKER_QUEUES

    if kind == "gpu":  # as `mas worker --queue gpu`: one process, 1 + lookahead threads
        lookahead = int(env.get("MAS_GPU_LOOKAHEAD", GpuSettings.model_fields["lookahead"].default))
        pool = ["-P", "threads", "-c", str(1 + lookahead)]
    else:
        pool = ["-P", "prefork", "-c", str(concurrency)]
    return ["celery", "-A", "mas", "worker", "-Q", ",".join(WORKER_QUEUES[kind]), "-n", name, *pool,
            "--prefetch-multiplier", "1", "-l", "INFO", "--without-gossip", "--without-mingle"]  # fmt: skip


class CeleryWorker(CeleryProcess):
    """A real Celery worker with the flags `mas worker` gives it."""

    def __init__(
        self,
        *,
        kind: str,
        name: str,
        env: dict[str, str],
        log_dir: Path,
        concurrency: int = 1,
        extra_args: Sequence[str] = (),
    ) -> None:
        args = [*worker_argv(kind, name, env=env, concurrency=concurrency), *extra_args]
        super().__init__(args=args, name=name, env=env, log_dir=log_dir)


class Beat(CeleryProcess):
    """`mas beat`, as a user starts it."""

    ready_line = "beat: Starting..."

    def __init__(self, *, env: dict[str, str], log_dir: Path) -> None:
        super().__init__(args=["mas.cli", "beat"], name="beat", env=env, log_dir=log_dir)


class BatchEnded(AssertionError):
    """A batch a test waited on ended without being done."""


class IsolatedStudio:
    def __init__(self, data_dir: Path, **env: str):
        self.data_dir = data_dir
        self.env = {**os.environ, "MAS_DATA_DIR": str(data_dir), "PYTHONPATH": str(ROOT), **env}
        for key in ("MAS_DATABASE_URL", "MAS_BROKER_URL"):
            if key not in env:
                self.env.pop(key, None)
        with mock.patch.dict(os.environ, self.env, clear=True):  # read as the studio's processes read it
            self.settings = Settings()
        self.workers: list[CeleryProcess] = []
        self.worker_args: list[str] = []

    def __enter__(self) -> IsolatedStudio:
        try:
            services.up(self.settings)
            db.find(self.settings)
        except BaseException:
            services.down(self.settings)  # a server that started before the failure must not outlive the test
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            for worker in self.workers:
                worker.stop()
        finally:  # a worker that would not stop must not leave the studio's servers running after the suite
            services.down(self.settings)

    def worker(self, kind: str, *, concurrency: int = 1, **env: str) -> CeleryWorker:
        w = CeleryWorker(
            kind=kind,
            name=f"{kind}{len(self.workers)}@reliability",
            env={**self.env, **env},
            log_dir=self.data_dir,
            concurrency=concurrency,
            extra_args=self.worker_args,
        )
        self.workers.append(w)
        w.wait_ready()
        return w

    def beat(self) -> Beat:
        """Start `mas beat`; stopped with the studio like the workers."""
        beat = Beat(env=self.env, log_dir=self.data_dir)
        self.workers.append(beat)
        beat.wait_ready()
        return beat

    def mas(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "mas.cli", *args],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def enqueue(self, request: str) -> int:
        result = self.mas("enqueue", request)
        assert result.returncode == 0, result.stderr
        return int(result.stdout.split()[1].rstrip(":"))

    def videos(self, batch_id: int) -> list[Video]:
        with db.session_scope(self.settings) as s:
            return list(s.scalars(sa.select(Video).where(Video.batch_id == batch_id).order_by(Video.id)))

    def render_running(self, batch_id: int) -> StepLease | None:
        """A render of the batch holding its lease now, or None."""
        with db.session_scope(self.settings) as s:
            return s.scalars(
                sa.select(StepLease)
                .join(Video, Video.id == StepLease.video_id)
                .where(Video.batch_id == batch_id, StepLease.step == "render", StepLease.token.is_not(None))
            ).first()

    def lease_lapsed(self, lease: StepLease) -> bool:
        """The video's lease is dead as `mas recover` reads it (`leases.dead`), or another holder took it over."""
        if lease.video_id in leases.dead(self.settings):
            return True
        with db.session_scope(self.settings) as s:
            now = s.get(StepLease, (lease.video_id, lease.attempt, lease.step))
            return now is None or now.token != lease.token

    def kill_mid_render(self, gpu: CeleryWorker, batch_id: int) -> tuple[StepLease, subprocess.CompletedProcess]:
        """SIGKILL `gpu` while a render of the batch holds its lease, start another gpu worker and, once the
        killed render's lease has lapsed, run `mas recover`: that lease, and what `mas recover` did."""
        self.wait_until(lambda: self.render_running(batch_id) is not None, what="a render holding its lease")
        lease = self.render_running(batch_id)
        assert lease is not None
        gpu.kill()
        self.worker("gpu")
        self.wait_until(lambda: self.lease_lapsed(lease), timeout=60, what="the killed render's lease to lapse")
        return lease, self.mas("recover")

    def wait_until(self, condition, *, timeout: float = 180, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if condition():
                    return
            except sa.exc.OperationalError:
                pass  # the database may be restarting in the test
            time.sleep(0.3)
        raise TimeoutError(f"timed out waiting for {what}")

    def quiet(self) -> bool:
        return quiet(self.settings)

    def wait_quiet(self, timeout: float = 120) -> None:
        wait_quiet(self.settings, timeout=timeout)

    def batch_done(self, batch_id: int) -> bool:
        """True once the batch is done; a batch that ended otherwise (failed, cancelled) raises at once with
        its reason and its videos' states, instead of leaving the test to time out saying nothing."""
        with db.session_scope(self.settings) as s:
            batch = s.get(Batch, batch_id)
            if batch.status in (BatchStatus.failed, BatchStatus.cancelled):
                raise BatchEnded(f"batch {batch_id} ended: {batch.failure_reason!r}; {self.describe_batch(batch_id)}")
            return batch.status == BatchStatus.done

    def wait_batch(self, batch_id: int, timeout: float = 180) -> None:
        try:
            self.wait_until(lambda: self.batch_done(batch_id), timeout=timeout, what=f"batch {batch_id}")
        except TimeoutError as late:
            raise TimeoutError(f"{late}: {self.describe_batch(batch_id)}") from None

    def describe_batch(self, batch_id: int) -> str:
        """The batch's status and each video's state and attempts, for a failure message."""
        with db.session_scope(self.settings) as s:
            batch = s.get(Batch, batch_id)
            videos = s.scalars(sa.select(Video).where(Video.batch_id == batch_id).order_by(Video.id))
            states = [(v.id, v.state.value, v.attempt_count, v.failure_reasons) for v in videos]
            return f"status {batch.status.value}, videos (id, state, attempts, reasons) {states}"


def quiet(settings: Settings) -> bool:
    """Nothing left to do: no message waits in any studio queue and none is delivered but unacknowledged
    (every task acknowledges late, when it has finished)."""
    app, client = app_for(settings), redis_client(settings)
    keys = [key for queues in names.WORKER_QUEUES.values() for queue in queues for key in queue_keys(app, queue)]
    return not any(client.llen(key) for key in keys) and not client.hlen("unacked")


def wait_quiet(settings: Settings, timeout: float = 120) -> None:
    """Until the studio is quiet twice in a row: what a recover or a resume sent has run, and sent nothing
    more. Then "nothing came back" is a fact, not a guess about how long to wait."""
    seen = [False]

    def twice() -> bool:
        seen.append(quiet(settings))
        return seen[-1] and seen[-2]

    wait_for(twice, timeout=timeout, what="the studio to have nothing left to do", interval=0.3)
