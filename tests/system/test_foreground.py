"""`mas run`: the whole studio in one terminal, as a newcomer starts it; Ctrl-C stops it all, a child that
dies is started again, and one that keeps dying stops the rest.

Each test runs the real command in a subprocess against embedded services in a data folder of its own, and
sends signals as a terminal would (to the command's process group; the children have groups of their own).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

from mas import db
from mas.runtime import services
from tests.studio import ROOT, IsolatedStudio

LABELS = ("cpu  | ", "gpu  | ", "beat | ")


class RunningStudio:
    """`mas run` in its own session, its labelled output collected line by line."""

    def __init__(self, studio: IsolatedStudio) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mas.cli", "run", "--concurrency", "1", "--grace", "20"], env=studio.env, cwd=ROOT,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, text: str, *, timeout: float = 120) -> str:
        """The first output line containing `text`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if found := next((line for line in self.lines if text in line), None):
                return found
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"no line with {text!r}:\n{self.output[-4000:]}")

    def children(self) -> list[psutil.Process]:
        """Every process below `mas run`: workers, their pool processes, beat."""
        return psutil.Process(self.proc.pid).children(recursive=True)

    def ctrl_c(self) -> None:
        os.killpg(self.proc.pid, signal.SIGINT)

    def wait(self, timeout: float = 90) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(5)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            for child in self.children():
                child.kill()
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Those of `processes` still running after a few seconds' grace."""
    return psutil.wait_procs(processes, timeout=5)[1]


@pytest.fixture
def studio():
    with tempfile.TemporaryDirectory(prefix="mas-run-") as tmp:
        Path(tmp).chmod(0o755)  # the embedded PostgreSQL runs as another user when we are root
        studio = IsolatedStudio(Path(tmp))  # not entered: `mas run` brings the services up itself
        try:
            yield studio
        finally:
            services.down(studio.settings)


@pytest.fixture
def running(studio):
    run = RunningStudio(studio)
    try:
        run.wait_for("mas  | ready: cpu, gpu, beat", timeout=180)
        db.find(studio.settings, start=False)  # the database `mas run` started, found as a process finds it
        yield run
    finally:
        run.kill()


def test_mas_run_makes_a_batch_and_ctrl_c_stops_every_child(studio, running):
    ready_lines = [line for line in running.lines if line.endswith(" ready.") or "beat: Starting..." in line]
    assert sorted(line[: len(LABELS[0])] for line in ready_lines) == sorted(LABELS)

    batch_id = studio.enqueue("Create 2 videos of paper boats")
    studio.wait_batch(batch_id, timeout=180)
    assert len(studio.videos(batch_id)) == 2
    assert running.wait_for("Task gpu.tasks.generate_video[").startswith("gpu  | ")
    assert running.wait_for("Task tasks.pipeline.plan_batch[").startswith("cpu  | ")
    assert running.wait_for("Sending due task", timeout=60).startswith("beat | ")  # beat drives the workers

    children = running.children()
    assert len(children) >= 4  # two workers, the cpu worker's pool processes (the gpu worker runs threads), beat
    running.ctrl_c()
    assert running.wait(timeout=90) == 0, running.output[-4000:]
    assert alive(children) == []
    assert "mas  | all stopped" in running.output
    assert "Warm shutdown" in running.output


def test_a_child_that_dies_is_started_again_and_one_that_keeps_dying_stops_the_run(running):
    """A worker killed (as an out-of-memory kill would) is started again and says so; one killed more than
    RESTARTS times within a minute stops the others and fails the run."""
    from mas.runtime.foreground import RESTARTS

    def gpu_pid(nth: int) -> int:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            started = [line for line in running.lines if "mas  | started gpu (pid" in line]
            if len(started) >= nth:
                return int(started[nth - 1].split("pid ")[1].rstrip(")"))
            time.sleep(0.1)
        raise TimeoutError(f"gpu not started {nth} times:\n" + "\n".join(running.lines[-30:]))

    first = gpu_pid(1)
    os.kill(first, signal.SIGKILL)
    assert "gpu was killed by SIGKILL; starting it again (1 of at most" in running.wait_for("starting it again")
    second = gpu_pid(2)
    assert running.proc.poll() is None  # the run goes on
    children = running.children()
    os.kill(second, signal.SIGKILL)
    for nth in range(3, RESTARTS + 2):  # RESTARTS + 1 deaths in all, well within a minute
        os.kill(gpu_pid(nth), signal.SIGKILL)
    assert running.wait(timeout=120) == 1
    assert alive(children) == []  # the others stopped, the dead worker's pool processes too
    assert f"gpu was killed by SIGKILL, {RESTARTS + 1} times within 60 s; stopped cpu, beat" in running.lines[-1]
