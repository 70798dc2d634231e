"""Director, Writer, Cameraman and Consolidator played by agents on the Letta server.

The roles are `mas.agents.asking`'s, as for every model-backed backend; here is the transport: a role
call brings the server's core blocks up to date with the studio's, sends the question's message to the
role's agents (one per conversation of the acting user's crew: `mas.agents.conversations`) and validates
the JSON object of its reply. Each agent takes one call at a time (Letta loses in-context messages when one
agent gets two at once); a role's calls run in parallel on its several agents.
"""

from __future__ import annotations

import json
import logging

from pydantic import ValidationError

from mas.agents import conversations
from mas.agents.asking import AskingCameraman, AskingConsolidator, AskingDirector, AskingWriter
from mas.agents.letta.blocks import push_studio_blocks
from mas.agents.letta.client import client, translated
from mas.agents.letta.errors import LettaNotFound, LettaReplyError
from mas.agents.letta.provisioning import crew
from mas.agents.letta.replies import REPLY_EXCERPT_CHARS, reply_object
from mas.agents.meaning import StudioMeaning
from mas.agents.protocol import Question, Reply
from mas.agents.replies import problem
from mas.agents.roles import Agents
from mas.config import Settings
from mas.domain.identity import Actor

log = logging.getLogger(__name__)

MESSAGE_TIMEOUT_S = 300.0
"""Longest a role call may take: an LLM turn, tool steps included."""


class RoleAgent:
    """One Letta agent a role talks to (an `Asker`): sends a question, returns its validated reply.

    `serialize=False` skips the advisory locks, for callers with no studio database to hold them in.
    """

    def __init__(self, settings: Settings, actor: Actor, role: str, *, serialize: bool = True) -> None:
        self.settings, self.actor, self.role, self.serialize = settings, actor, role, serialize

    def ask(self, question: Question[Reply]) -> Reply:
        push_studio_blocks(self.settings, self.actor, lock=self.serialize)
        prefer = question.video_id or question.batch_id
        with conversations.turn(
            self.settings, self.role, prefer=prefer, lock=self.serialize, user=self.actor.user
        ) as talk:
            response = self._send(talk, question.message(), question.task)
        value = reply_object(response, agent=talk, task=question.task)
        try:
            return question.reply.model_validate(value, context=question.context)
        except ValidationError as error:
            raise LettaReplyError(
                agent=talk,
                task=question.task,
                problem=problem(error),
                excerpt=json.dumps(value)[:REPLY_EXCERPT_CHARS],
            ) from None

    def _send(self, talk: str, text: str, task: str):
        api = client(self.settings).with_options(timeout=MESSAGE_TIMEOUT_S, max_retries=0)
        known = crew(self.settings, self.actor).agents.get(talk)
        if known is not None:
            try:
                return self._message(api, talk, known.id, text, task)
            except LettaNotFound:
                log.warning("Letta agent %s (%s) vanished; looking it up again", talk, known.id)
        return self._message(api, talk, crew(self.settings, self.actor, refresh=True).agents[talk].id, text, task)

    def _message(self, api, talk: str, agent_id: str, text: str, task: str):
        with translated(f"{talk} {task}"):
            return api.agents.messages.create(agent_id, messages=[{"role": "user", "content": text}])


def letta_agents(settings: Settings, actor: Actor, *, serialize: bool = True) -> Agents:
    """The four roles played by agents on the Letta server (provisioned on first use).

    The director's sleeptime companion consolidates core memory on its own schedule and answers with
    memory edits, never with a reply, so the synchronous consolidation the pipeline asks for goes to the
    director itself.
    """
    director = RoleAgent(settings, actor, "director", serialize=serialize)
    meaning = StudioMeaning(settings)
    return Agents(
        director=AskingDirector(director, meaning=meaning),
        writer=AskingWriter(RoleAgent(settings, actor, "writer", serialize=serialize), meaning=meaning),
        cameraman=AskingCameraman(RoleAgent(settings, actor, "cameraman", serialize=serialize)),
        consolidator=AskingConsolidator(director),
    )
