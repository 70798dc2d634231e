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

Selected with `broker_transport_options["queue_order_strategy"]` (see `mas.celery_app`); a worker with one
queue is unaffected.
"""

from __future__ import annotations

from collections.abc import Iterable


class StickyCycle:
    """Queue order for kombu's Redis transport: the queue that delivered last is polled first."""

    def __init__(self, it: Iterable[str] | None = None, *, streak_limit: int = 0) -> None:
        #: Queues, in the order they are polled.
        self.items: list[str] = []
        #: Deliveries in a row from the front queue after which the others go first once (0: no limit).
        self.streak_limit = streak_limit
        self.streak = 0
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
        if self.streak_limit and self.streak >= self.streak_limit and len(self.items) > 1:
            return (self.items[1:] + self.items[:1])[:n]
        return self.items[:n]

    def rotate(self, last_used: str) -> str:
        """Move the queue that just delivered to the front and count the run."""
        if self.items and self.items[0] == last_used:
            self.streak += 1
        elif last_used in self.items:
            self.items.remove(last_used)
            self.items.insert(0, last_used)
            self.streak = 1
        return last_used
