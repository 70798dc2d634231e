"""Turns on this worker's GPU, so the next task is ready the moment the GPU frees.

A gpu worker runs 1 + MAS_GPU_LOOKAHEAD tasks at once, in threads: while one task holds the GPU, the next
has already taken its message, claimed its lease and read its inputs, and (with ComfyUI) queued its prompt
on the render server. Work that uses this process's GPU (an in-process render, a grading, `mas grade`, the
Tuner) takes a turn first: one holder at a time, handed straight to the next waiter when it ends. Waiters
go in order of arrival, a high-priority one as if it had arrived `head_start_seconds` earlier: it passes
recent normal work, never work that has waited longer than that, so a stream of interactive work cannot
starve a batch.

Every turn has a time limit. The holder is told when it has run out (`Turn.expired`, which in-process
renders poll through their `should_stop`); one still holding the GPU `GRACE_SECONDS` later is stuck in a
model call that cannot be stopped, and the watchdog ends the worker process, as Celery's hard time limit
ends a pool process: its tasks are redelivered and their leases let them resume. Nothing holds the GPU for
ever.

The turns keep a record of when the GPU was held (`busy`), published with the worker's stats.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

GRACE_SECONDS = 60.0
"""How long past its limit a turn may go on before the watchdog ends the worker."""

EXIT_STUCK = 70
"""The worker's exit status when the watchdog ends it."""

BUSY_RECORD = 2000
"""How many past turns `busy` keeps."""


@dataclass(kw_only=True)
class Turn:
    """One turn on the GPU: what holds it and until when."""

    what: str
    priority: str
    started: float = field(default_factory=time.monotonic)
    limit_seconds: float

    @property
    def deadline(self) -> float:
        return self.started + self.limit_seconds

    def expired(self) -> bool:
        """True once the turn has used its time (the holder should stop and give the GPU back)."""
        return time.monotonic() >= self.deadline


def rank(priority: str, *, head_start_seconds: float, now: float | None = None) -> float:
    """Where work stands in line (lower goes first): its arrival time, earlier by the head start when it
    is high priority. Wall-clock seconds, so ranks from different workers sharing one ComfyUI compare."""
    arrived = time.time() if now is None else now
    return arrived - (head_start_seconds if priority == "high" else 0.0)


def exit_worker() -> None:
    """What the watchdog does to a worker whose GPU call is stuck (a test may pass something else)."""
    os._exit(EXIT_STUCK)


class GpuTurns:
    """One process's turns on its GPU. Thread-safe; one per process (`gpu.factory.gpu_turns`)."""

    def __init__(
        self,
        *,
        head_start_seconds: float,
        grace_seconds: float = GRACE_SECONDS,
        on_stuck: Callable[[], None] = exit_worker,
    ) -> None:
        self.head_start_seconds = head_start_seconds
        self.grace_seconds = grace_seconds
        self.on_stuck = on_stuck
        #: (start, end, what) of past turns, wall-clock seconds, oldest first.
        self.busy: deque[tuple[float, float, str]] = deque(maxlen=BUSY_RECORD)
        #: Turns taken and seconds held since the process started.
        self.taken = 0
        self.held_seconds = 0.0
        self._lock = threading.Condition()
        self._waiting: list[tuple[float, int]] = []
        self._tickets = itertools.count()
        self._holder: Turn | None = None
        self._watchdog: threading.Thread | None = None

    @contextmanager
    def turn(self, *, what: str, priority: str = "normal", limit_seconds: float) -> Iterator[Turn]:
        """Wait for the GPU, hold it for the block, then hand it to the next waiter."""
        ticket = (rank(priority, head_start_seconds=self.head_start_seconds), next(self._tickets))
        with self._lock:
            self._start_watchdog()
            heapq.heappush(self._waiting, ticket)
            while self._holder is not None or self._waiting[0] != ticket:
                self._lock.wait()
            heapq.heappop(self._waiting)
            turn = self._holder = Turn(what=what, priority=priority, limit_seconds=limit_seconds)
        began = time.time()
        try:
            yield turn
        finally:
            with self._lock:
                self._holder = None
                ended = time.time()
                self.busy.append((began, ended, what))
                self.taken += 1
                self.held_seconds += ended - began
                self._lock.notify_all()

    @property
    def waiting(self) -> int:
        with self._lock:
            return len(self._waiting)

    def _start_watchdog(self) -> None:
        if self._watchdog is None or not self._watchdog.is_alive():
            self._watchdog = threading.Thread(target=self._watch, name="gpu-turn-watchdog", daemon=True)
            self._watchdog.start()

    def _watch(self) -> None:
        while True:
            time.sleep(1.0)
            with self._lock:
                holder = self._holder
            if holder is not None and time.monotonic() > holder.deadline + self.grace_seconds:
                log.critical(
                    "%s held the GPU %.0f s past its %.0f s limit and does not stop: ending the worker "
                    "(its tasks are redelivered)",
                    holder.what,
                    time.monotonic() - holder.deadline,
                    holder.limit_seconds,
                )
                self.on_stuck()
                return
