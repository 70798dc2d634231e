"""The whole studio in one terminal (`mas run`): a cpu worker, a gpu worker and beat as child processes.

Every line a child prints comes out here with its label (`cpu  | ...`), so the three logs interleave
readably. Ctrl-C or SIGTERM stops them all in order: a warm shutdown first (a worker finishes its running
task and hands reserved ones back), a cold shutdown after a bounded wait, then SIGKILL of whatever is left.
A child that exits on its own (killed for memory, a watchdog ending a stuck gpu worker) is started again
and the run says so; one that dies more than `RESTARTS` times within `RESTART_WINDOW_S` cannot start at
all, so the others are stopped the same way and the run fails naming it.

Each child runs in a process group of its own: the terminal's Ctrl-C reaches only the supervisor, which
then stops the children in order rather than all at once, and the last resort kills a worker together
with its pool processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

from mas.config import Settings
from mas.errors import PermanentError
from mas.runtime.processes import beat_argv, worker_argv

COLD_WAIT_S = 10.0
"""How long a cold shutdown may take before SIGKILL."""

POLL_S = 0.2

RESTARTS = 3
RESTART_WINDOW_S = 60.0
"""A child is started again after it dies, up to RESTARTS times within RESTART_WINDOW_S seconds."""


class ChildDied(PermanentError):
    """A child of the foreground studio exited on its own; the others were stopped."""


@dataclass(frozen=True, kw_only=True)
class Child:
    """One process of the foreground studio."""

    label: str
    argv: list[str]
    ready_text: str  # a line of its output containing this says it is up
    cold_signal: int = signal.SIGQUIT  # a Celery worker's cold shutdown: running tasks are cut off


def studio_children(settings: Settings, *, concurrency: int | None = None, loglevel: str = "INFO") -> list[Child]:
    """The studio of one machine: a cpu worker, a gpu worker and beat."""
    return [
        Child(
            label="cpu",
            argv=worker_argv(settings, "cpu", concurrency=concurrency, loglevel=loglevel),
            ready_text=" ready.",
        ),
        Child(label="gpu", argv=worker_argv(settings, "gpu", loglevel=loglevel), ready_text=" ready."),
        Child(
            label="beat",
            argv=beat_argv(settings, loglevel=loglevel),
            ready_text="beat: Starting...",
            cold_signal=signal.SIGTERM,
        ),
    ]


class Supervisor:
    """Runs children in the foreground until a signal arrives, starting again one that dies, then stops them
    all."""

    def __init__(
        self, children: Sequence[Child], *, grace_s: float = 30.0, ready_message: str = "", out: TextIO | None = None
    ) -> None:
        self.children = list(children)
        self.grace_s = grace_s
        self.ready_message = ready_message
        self.out = out or sys.stdout
        self._width = max(len(label) for label in ["mas", *(c.label for c in self.children)])
        self._write_lock = threading.Lock()
        self._signals = 0  # SIGINT / SIGTERM received; a signal handler only counts
        self._procs: dict[str, subprocess.Popen] = {}
        self._relays: list[threading.Thread] = []
        self._ready: set[str] = set()
        self._ready_lock = threading.Lock()
        self._deaths: dict[str, list[float]] = {}

    def run(self) -> None:
        """Start every child and supervise them; return after a requested stop.

        Raises ChildDied (after stopping the others) when a child kept dying.
        """
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            for child in self.children:
                self._start(child)
            died = self._wait_for_stop()
        finally:
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if died is not None:
            others = [c.label for c in self.children if c.label != died]
            raise ChildDied(
                f"{died} {_exit_reason(self._procs[died].returncode)}, {len(self._deaths[died])} times within "
                f"{RESTART_WINDOW_S:g} s; stopped {', '.join(others)} (its last lines are above)"
            )

    # --- starting and watching ------------------------------------------------------------------------

    def _on_signal(self, signum, frame) -> None:  # noqa: ARG002
        self._signals += 1

    def _start(self, child: Child) -> None:
        proc = subprocess.Popen(
            child.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            process_group=0,
        )
        self._procs[child.label] = proc
        self.say(f"started {child.label} (pid {proc.pid})")
        relay = threading.Thread(target=self._relay, args=(child, proc), name=f"relay-{child.label}", daemon=True)
        relay.start()
        self._relays.append(relay)

    def _relay(self, child: Child, proc: subprocess.Popen) -> None:
        """Copy the child's output line by line, labelled; note when it says it is up."""
        assert proc.stdout is not None  # started with stdout=PIPE
        for line in proc.stdout:
            self._write(child.label, line.rstrip("\n"))
            if child.ready_text in line and self._mark_ready(child.label):
                self.say(f"ready: {', '.join(c.label for c in self.children)}. {self.ready_message}".rstrip())

    def _mark_ready(self, label: str) -> bool:
        """Note that `label` is up; True the first time every child is."""
        with self._ready_lock:
            if label in self._ready:
                return False
            self._ready.add(label)
            return len(self._ready) == len(self.children)

    def _wait_for_stop(self) -> str | None:
        """Block until a signal (None) or until a child keeps dying (its label); start again one that died."""
        while not self._signals:
            for child in self.children:
                proc = self._procs[child.label]
                if proc.poll() is None:
                    continue
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)  # what is left of it: a worker's pool processes
                now = time.monotonic()
                deaths = [t for t in self._deaths.get(child.label, []) if now - t < RESTART_WINDOW_S] + [now]
                self._deaths[child.label] = deaths
                if len(deaths) > RESTARTS:
                    return child.label
                self.say(
                    f"{child.label} {_exit_reason(proc.returncode)}; starting it again ({len(deaths)} of at most "
                    f"{RESTARTS} restarts within {RESTART_WINDOW_S:g} s)"
                )
                self._start(child)
            time.sleep(POLL_S)
        return None

    # --- stopping -------------------------------------------------------------------------------------

    def _stop_all(self) -> None:
        running = self._running()
        if running:
            self.say(
                f"stopping {', '.join(running)}: running tasks get up to {self.grace_s:g} s to finish "
                "(Ctrl-C again cuts them off)"
            )
            self._send(running, lambda child: signal.SIGTERM)  # warm shutdown  # noqa: ARG005
            running = self._wait_exit(running, self.grace_s, interruptible=True)
        if running:
            self.say(f"cold shutdown of {', '.join(running)}")
            self._send(running, lambda child: child.cold_signal)
            running = self._wait_exit(running, COLD_WAIT_S)
        for proc in self._procs.values():  # whatever is left of each group, pool processes included
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for relay in self._relays:
            relay.join(timeout=5)
        if self._procs:
            self.say("all stopped")

    def _running(self) -> list[str]:
        return [label for label, proc in self._procs.items() if proc.poll() is None]

    def _send(self, labels: list[str], which_signal) -> None:
        for child in self.children:
            if child.label in labels:
                with contextlib.suppress(ProcessLookupError):
                    self._procs[child.label].send_signal(which_signal(child))

    def _wait_exit(self, labels: list[str], timeout: float, *, interruptible: bool = False) -> list[str]:
        """Wait until the children exit, the time is up, or (if interruptible) another signal arrives."""
        deadline = time.monotonic() + timeout
        signals_seen = self._signals
        while time.monotonic() < deadline and not (interruptible and self._signals > signals_seen):
            labels = [label for label in labels if self._procs[label].poll() is None]
            if not labels:
                break
            time.sleep(POLL_S)
        return [label for label in labels if self._procs[label].poll() is None]

    # --- output ---------------------------------------------------------------------------------------

    def say(self, text: str) -> None:
        """A line of the supervisor's own, labelled `mas`."""
        self._write("mas", text)

    def _write(self, label: str, text: str) -> None:
        with self._write_lock, contextlib.suppress(BrokenPipeError, ValueError):
            self.out.write(f"{label:<{self._width}} | {text}\n")
            self.out.flush()


def _exit_reason(returncode: int) -> str:
    if returncode < 0:
        return f"was killed by {signal.Signals(-returncode).name}"
    return f"exited with status {returncode}"


def run_studio(
    settings: Settings,
    *,
    concurrency: int | None = None,
    loglevel: str = "INFO",
    grace_s: float = 30.0,
    ready_message: str = "",
) -> None:
    """Run the studio of one machine in the foreground until Ctrl-C / SIGTERM (or a child's death)."""
    children = studio_children(settings, concurrency=concurrency, loglevel=loglevel)
    Supervisor(children, grace_s=grace_s, ready_message=ready_message).run()
