"""Agent backends behind the role interfaces of `mas.agents.roles`."""

from mas.agents.roles import Agents
from mas.config import Settings


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
            writer=OfflineWriter(),
            cameraman=OfflineCameraman(),
            consolidator=OfflineConsolidator(),
        )
    raise NotImplementedError(f"agent backend {settings.agent_backend!r} is not available yet")
