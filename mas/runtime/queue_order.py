"""The order in which a worker polls its queues: stay with the kind of work it is doing while that has work.

The gpu worker consumes two queues, renders (`gpu`) and gradings (`gpu-grade`), and each kind needs its own
models. Kombu's Redis transport asks a "queue cycle" for the order of the keys of each BRPOP (the first
non-empty one delivers) and tells it which queue delivered. Its built-in cycles are round robin, which moves
the queue that just delivered to the back (the gpu would alternate models video by video), and a fixed
priority, which cannot follow the batch (refinement renders arriving one by one would each interrupt a run
of gradings). `StickyCycle` moves the queue that just delivered to the front: the worker keeps to the
loaded model while its queue has work and turns to the other only when it runs dry.

`streak_limit` bounds how long one kind may hold the worker while the other waits: after that many
deliveries in a row from one queue, the others are polled first once, so a night of first renders does not
hold back every grading (and the Writer's learning from them) until morning.

High-priority work has queues of its own (named with `names.URGENT_SUFFIX`): they are polled before all
others, so interactive work (an A/B test, `mas grade`) is taken at the next free slot. `urgent_streak_limit`
keeps that from starving a batch: after that many urgent deliveries in a row, the other queues are polled
first once.

Selected with `broker_transport_options["queue_order_strategy"]` (see `mas.runtime.app`); a worker with one
queue is unaffected.
"""

from __future__ import annotations

from collections.abc import Iterable

from mas.names import is_urgent


class StickyCycle:
    """Queue order for kombu's Redis transport: the queue that delivered last is polled first."""

    def __init__(self, it: Iterable[str] | None = None, *, streak_limit: int = 0, urgent_streak_limit: int = 0) -> None:
        #: Queues, in the sticky order (urgent ones are polled before these whatever their place).
        self.items: list[str] = []
        #: Deliveries in a row from the front queue after which the others go first once (0: no limit).
        self.streak_limit = streak_limit
        self.streak = 0
        #: Urgent deliveries in a row after which the other queues go first once (0: no limit).
        self.urgent_streak_limit = urgent_streak_limit
        self.urgent_streak = 0
        if it is not None:
            self.update(it)

    def update(self, it: Iterable[str]) -> None:
        """Take the worker's current queues: known ones keep their place, new ones join in name order.

        Kombu passes a set; sorting the new ones makes a fresh worker's first choice repeatable.
        """
        queues = set(it)
        self.items[:] = [q for q in self.items if q in queues] + sorted(queues.difference(self.items))

    def consume(self, n: int) -> list[str]:
        """The first `n` queues in polling order."""
        urgent = [q for q in self.items if is_urgent(q)]
        normal = [q for q in self.items if not is_urgent(q)]
        if self.streak_limit and self.streak >= self.streak_limit and len(normal) > 1:
            normal = normal[1:] + normal[:1]
        if urgent and normal and self.urgent_streak_limit and self.urgent_streak >= self.urgent_streak_limit:
            return (normal + urgent)[:n]
        return (urgent + normal)[:n]

    def rotate(self, last_used: str) -> str:
        """Move the queue that just delivered to the front and count the run."""
        if is_urgent(last_used):
            self.urgent_streak += 1
            return last_used  # urgent queues go first anyway; the sticky order of the others stays
        self.urgent_streak = 0
        if self.items and [q for q in self.items if not is_urgent(q)][:1] == [last_used]:
            self.streak += 1
        elif last_used in self.items:
            self.items.remove(last_used)
            self.items.insert(0, last_used)
            self.streak = 1
        return last_used
