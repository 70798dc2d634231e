"""Agent backends behind the role interfaces of `mas.agents.roles`."""

from mas.agents.roles import Agents
from mas.config import Settings
from mas.errors import InvalidSettings


def backend(settings: Settings) -> Agents:
    """The agents configured by MAS_AGENT_BACKEND."""
    if settings.agent_backend == "offline":
        from mas.agents.offline import (
            OfflineCameraman,
            OfflineConsolidator,
            OfflineDirector,
            OfflineWriter,
        )

        return Agents(
            director=OfflineDirector(),
            writer=OfflineWriter(seconds=settings.offline_agent_seconds),
            cameraman=OfflineCameraman(seconds=settings.offline_agent_seconds),
            consolidator=OfflineConsolidator(),
        )
    if settings.agent_backend == "letta":
        from mas.agents.letta import letta_agents

        return letta_agents(settings)
    if settings.agent_backend == "llm":
        from mas.agents.llm import llm_agents
        from mas.learning import promotion as taste_promotion

        return llm_agents(settings, rank=taste_promotion.ranker(settings))
    raise InvalidSettings(f"unknown agent backend {settings.agent_backend!r}; use offline, letta or llm")
