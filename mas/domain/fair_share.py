"""Weighted fair sharing of the GPU between users (stride scheduling): pure arithmetic, no I/O.

Each user has a pass: how much of the GPU they were given, in units of their share. The next video let
through is the one of the waiting user with the lowest pass; giving it advances their pass by 1 / share, so
users with shares 3 and 1 who both wait get three videos and one, in turn, whatever each has queued. A user
who comes back after a pause starts at the studio's virtual time (the pass of the last video given), never
below it: time spent idle is not saved up as credit against the others.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from mas.errors import InvalidInput

T = TypeVar("T")


@dataclass
class Passes:
    """The fair queue's state: each user's pass and the virtual time."""

    by_user: dict[str, float] = field(default_factory=dict)
    virtual: float = 0.0


def check_share(share: float) -> float:
    """A share as the fair queue needs it: a finite number above 0 (what `mas users set --share` stores)."""
    if not math.isfinite(share) or share <= 0:
        raise InvalidInput(f"a GPU share is a number above 0 (positive and finite), got {share!r}")
    return share


def take_turns(
    waiting: Mapping[str, Sequence[T]], *, shares: Mapping[str, float], passes: Passes, room: int
) -> list[T]:
    """Up to `room` items from the users' queues (each already in the user's own order: their priorities,
    then oldest first), taken by lowest pass; `passes` is advanced in place. Ties go to the user listed
    first in `waiting` (the caller lists them oldest work first)."""
    queues = {user: list(items) for user, items in waiting.items() if items}
    for user in queues:
        passes.by_user[user] = max(passes.by_user.get(user, 0.0), passes.virtual)
    order = {user: i for i, user in enumerate(queues)}
    taken: list[T] = []
    while len(taken) < room and queues:
        user = min(queues, key=lambda u: (passes.by_user[u], order[u]))
        taken.append(queues[user].pop(0))
        passes.virtual = passes.by_user[user]
        passes.by_user[user] += 1 / check_share(shares.get(user, 1.0))
        if not queues[user]:
            del queues[user]
    return taken
