"""One call at a time per agent, across every process: an agent's memory is a conversation.

Two calls to one agent at once would interleave its messages (Letta even loses in-context messages);
calls to different agents run in parallel across cpu workers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from mas import db, locks, names
from mas.config import Settings

AGENT_LOCK_TIMEOUT_S = 600
"""Longest a call waits for another call to the same agent to finish before giving up (retryable)."""


@contextmanager
def agent_turn(settings: Settings, name: str) -> Iterator[None]:
    """Hold agent `name` for one call or maintenance step: nobody else talks to it meanwhile."""
    with locks.held(db.ready_engine(settings), names.agent_lock(name), timeout_s=AGENT_LOCK_TIMEOUT_S):
        yield
