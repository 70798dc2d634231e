"""A role's conversations: several calls of one role at once, each conversation one call at a time.

A conversation is one of a fixed pool of MAS_AGENT_CONVERSATIONS per role (`mas.memory.recall.conversation`:
`writer`, `writer.1`, ...; on a Letta server, one agent each). Every conversation of every role reads the
same core blocks and archival memory; each keeps its own recall buffer and summary, so two calls in flight
never see each other's half-finished exchange. A call takes a free conversation, the one its video used
before when that one is free (so a refinement usually continues its own thread), and waits only when all
are busy. Why a pool and not one per video or per worker process: see ARCHITECTURE.md.

An endpoint's capacity is separate (`endpoint_slot`): a small local server gets no more calls at once than
MAS_LLM_MAX_IN_FLIGHT, however many conversations and workers there are.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from mas import db, locks, names
from mas.config import Settings
from mas.memory import recall
from mas.models import users_own

TURN_TIMEOUT_S = 600
"""Longest a call waits for a free conversation of its role (or a free slot of its endpoint): retryable."""


def of_role(settings: Settings, role: str) -> tuple[str, ...]:
    """The conversations `role` holds."""
    return recall.conversations(role, settings.agents.conversations)


@contextmanager
def turn(
    settings: Settings, role: str, *, prefer: int | None = None, lock: bool = True, user: str | None = None
) -> Iterator[str]:
    """Hold a free conversation of `role` for one call and give its name; none else talks in it meanwhile.

    `prefer` (a video id, say) picks which conversation is tried first, so the calls about one thing keep
    to one conversation while it is free. `lock=False` holds nothing (callers with no studio database) and
    gives the preferred conversation. `user` makes the conversations that user's own (a Letta crew is per
    user; the llm backend's conversations are the studio's).
    """
    pool = (role,) if recall.is_sleeptime(role) else of_role(settings, role)  # sleeptime runs start clear, alone
    first = (prefer or 0) % len(pool)
    ordered = pool[first:] + pool[:first]
    if not lock:
        yield ordered[0]
        return
    by_lock = {names.agent_lock(users_own(name, user) if user else name): name for name in ordered}
    with locks.held_any(db.ready_engine(settings), list(by_lock), timeout_s=TURN_TIMEOUT_S) as held:
        yield by_lock[held]


@contextmanager
def exclusive(settings: Settings, conversation: str) -> Iterator[None]:
    """Hold one named conversation (maintenance of its buffer or of its Letta agent)."""
    with locks.held(db.ready_engine(settings), names.agent_lock(conversation), timeout_s=TURN_TIMEOUT_S):
        yield


@contextmanager
def endpoint_slot(settings: Settings, *, lock: bool = True) -> Iterator[None]:
    """Hold one of the LLM endpoint's MAS_LLM_MAX_IN_FLIGHT slots for one request."""
    if not lock:
        yield
        return
    slots = [names.endpoint_slot(settings.llm.url, i) for i in range(settings.llm.max_in_flight)]
    with locks.held_any(db.ready_engine(settings), slots, timeout_s=TURN_TIMEOUT_S):
        yield
