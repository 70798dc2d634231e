"""Agents over any OpenAI-compatible chat endpoint, with the studio's own memory (MAS_AGENT_BACKEND=llm).

The roles are `mas.agents.asking`'s (the same questions the Letta backend sends); each role is an
`LLMAgent` whose core, recall and archival memory the studio keeps in Postgres (`context`). The Director's
sleeptime companion consolidates from a clear buffer every MAS_SLEEPTIME_FREQUENCY interactions.
"""

from mas.agents.asking import AskingCameraman, AskingConsolidator, AskingDirector, AskingWriter, Ranker
from mas.agents.llm.agent import Exchange, LLMAgent
from mas.agents.llm.errors import LLMError, LLMMisconfigured, LLMRejected, LLMReplyError, LLMUnavailable
from mas.agents.meaning import StudioMeaning
from mas.agents.roles import Agents
from mas.config import Settings
from mas.domain.identity import Actor


def llm_agents(settings: Settings, actor: Actor, *, rank: Ranker | None = None, serialize: bool = True) -> Agents:
    """The four roles played by llm agents; `rank` (the user's taste) picks among Writer candidates."""
    meaning = StudioMeaning(settings)
    return Agents(
        director=AskingDirector(LLMAgent(settings, actor, "director", serialize=serialize), meaning=meaning),
        writer=AskingWriter(
            LLMAgent(settings, actor, "writer", serialize=serialize),
            candidates=settings.agents.writer_candidates,
            rank=rank,
            meaning=meaning,
        ),
        cameraman=AskingCameraman(LLMAgent(settings, actor, "cameraman", serialize=serialize)),
        consolidator=AskingConsolidator(
            LLMAgent(settings, actor, "director_sleeptime", history=False, serialize=serialize)
        ),
    )


__all__ = [
    "Exchange",
    "LLMAgent",
    "LLMError",
    "LLMMisconfigured",
    "LLMRejected",
    "LLMReplyError",
    "LLMUnavailable",
    "llm_agents",
]
