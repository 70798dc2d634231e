"""Agent backends behind the role interfaces of `mas.agents.roles`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mas.agents.roles import Agents
from mas.config import Settings
from mas.domain.identity import Actor
from mas.errors import InvalidSettings

if TYPE_CHECKING:
    from mas.agents.asking import Ranker


def backend(settings: Settings, actor: Actor, *, rank: Ranker | None = None) -> Agents:
    """The agents configured by MAS_AGENT_BACKEND, working for `actor` (whose taste blocks they read; on a Letta
    server, whose crew of agents). `rank` scores the Writer's candidate prompts by the user's
    taste (`mas.learning.promotion.ranker`, which learning, a room above, hands down); without it the model's
    first candidate wins."""
    if settings.agents.backend == "offline":
        from mas.agents.offline import (
            OfflineCameraman,
            OfflineConsolidator,
            OfflineDirector,
            OfflineWriter,
        )

        return Agents(
            director=OfflineDirector(),
            writer=OfflineWriter(seconds=settings.agents.offline_seconds),
            cameraman=OfflineCameraman(seconds=settings.agents.offline_seconds),
            consolidator=OfflineConsolidator(),
        )
    if settings.agents.backend == "letta":
        from mas.agents.letta import letta_agents

        return letta_agents(settings, actor)
    if settings.agents.backend == "llm":
        from mas.agents.llm import llm_agents

        return llm_agents(settings, actor, rank=rank)
    raise InvalidSettings(f"unknown agent backend {settings.agents.backend!r}; use offline, letta or llm")
