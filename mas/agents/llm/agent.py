"""One llm agent: a role's question sent with its memory, the reply validated, corrected, remembered.

A call holds one of its role's conversations (`mas.agents.conversations`), so a conversation never
interleaves while calls of one role run in parallel across cpu workers, and each request holds one of the
endpoint's slots (MAS_LLM_MAX_IN_FLIGHT). What a call cost (tries, seconds, prompt, cached and completion
tokens) is written to `agent_calls` with the video or batch it was about. A reply that does not validate is
shown its validation error and asked again, `MAS_LLM_REPLY_RETRIES` times, then the step fails with the
reason (`LLMReplyError`, permanent: the batch or video records it). Only a validated exchange enters the
conversation's recall buffer, so a failed call leaves its memory as it was.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

import sqlalchemy as sa
from pydantic import ValidationError

from mas.agents import conversations
from mas.agents.llm.client import complete
from mas.agents.llm.context import alternating, changing_memory, conversation, system_prompt
from mas.agents.llm.errors import LLMReplyError
from mas.agents.protocol import Question, Reply
from mas.agents.replies import parse_json_object, problem
from mas.config import Settings
from mas.db import session_scope
from mas.domain.identity import Actor
from mas.memory import recall
from mas.models import AgentCall

log = logging.getLogger(__name__)

REPLY_EXCERPT_CHARS = 200
"""How much of a bad reply an error quotes."""


@dataclass(frozen=True, kw_only=True)
class Exchange:
    """What one call cost and how it went (the benchmark and the logs read it)."""

    agent: str  # the conversation that answered (`writer.2`)
    task: str
    tries: int
    seconds: float
    prompt_tokens: int
    cached_tokens: int  # of prompt_tokens, those the endpoint served from its prompt cache
    completion_tokens: int
    mode: str
    valid: bool


class LLMAgent:
    """An `Asker` over an OpenAI-compatible endpoint, with the studio's memory as the agent's memory.

    `history=False` sends no recalled messages (the sleeptime agent, which starts every run clear).
    `serialize=False` holds no conversation or endpoint slot and records nothing, for callers with no
    studio database.
    """

    def __init__(
        self, settings: Settings, actor: Actor, agent: str, *, history: bool = True, serialize: bool = True
    ) -> None:
        self.settings, self.actor, self.agent, self.history, self.serialize = settings, actor, agent, history, serialize
        self.last: Exchange | None = None

    def ask(self, question: Question[Reply]) -> Reply:
        prefer = question.video_id or question.batch_id
        with conversations.turn(self.settings, self.agent, prefer=prefer, lock=self.serialize) as talk:
            try:
                reply, text = self._answer(question, talk)
            finally:
                if self.serialize and self.last is not None:
                    _record(self.settings, self.last, question)
            recall.append(self.settings, talk, role="user", content=question.message())
            recall.append(self.settings, talk, role="assistant", content=text)
        return reply

    def _answer(self, question: Question[Reply], talk: str) -> tuple[Reply, str]:
        """The validated reply. The stable part of the prompt comes first (`system_prompt`, then the
        conversation's summary and messages), what changes every call last (`changing_memory` and the
        question), so an endpoint's prefix cache serves all but the end of each call."""
        self.last = None
        messages = [{"role": "system", "content": system_prompt(self.settings, self.actor, self.agent)}]
        if self.history and not question.alone:
            messages += conversation(self.settings, talk)
        now = changing_memory(self.settings, self.actor, talk)
        messages.append({"role": "user", "content": f"{now}\n\n{question.message()}"})
        schema = question.schema()
        prompt_tokens = cached_tokens = completion_tokens = 0
        started = time.monotonic()
        refused: set[str] = set()
        for attempt in range(1, self.settings.llm.reply_retries + 2):
            with conversations.endpoint_slot(self.settings, lock=self.serialize):
                completion = complete(
                    self.settings,
                    alternating(messages),
                    schema=schema,
                    name=question.task,
                    max_tokens=question.max_tokens,
                )
            prompt_tokens += completion.prompt_tokens
            cached_tokens += completion.cached_tokens
            completion_tokens += completion.completion_tokens
            reply, trouble = _validated(question, completion.text)
            self.last = Exchange(
                agent=talk,
                task=question.task,
                tries=attempt,
                seconds=time.monotonic() - started,
                prompt_tokens=prompt_tokens,
                cached_tokens=cached_tokens,
                completion_tokens=completion_tokens,
                mode=completion.mode,
                valid=reply is not None,
            )
            if reply is None and completion.truncated:
                trouble = f"the reply was cut at {completion.completion_tokens} tokens; keep every text short"
            if reply is not None:
                log.info(
                    "llm %s %s: valid reply after %d tries in %.2f s (%d+%d tokens, %d cached, %s)",
                    talk,
                    question.task,
                    attempt,
                    self.last.seconds,
                    prompt_tokens,
                    completion_tokens,
                    cached_tokens,
                    completion.mode,
                )
                return reply, json.dumps(reply.model_dump(), ensure_ascii=False)
            log.warning("llm %s %s: reply %d invalid: %s", talk, question.task, attempt, trouble)
            if _said(completion.text) in refused:
                # told what was wrong, it answered word for word as before: another try costs a call and
                # would most likely answer the same again
                trouble = f"the same invalid reply again after its correction; {trouble}"
                break
            refused.add(_said(completion.text))
            # a cut reply is a ramble: shown again, it is continued; the model is only told it was too long
            shown = completion.text[:REPLY_EXCERPT_CHARS] + " ..." if completion.truncated else completion.text
            messages += [
                {"role": "assistant", "content": shown[: REPLY_EXCERPT_CHARS * 10]},
                {
                    "role": "user",
                    "content": f"That reply is invalid: {trouble}. Answer again with exactly one "
                    f"JSON object of the shape {question.shape}, and nothing else.",
                },
            ]
        raise LLMReplyError(
            f"{self.agent} answered task {question.task!r} {attempt} times without a valid reply; last "
            f"problem: {trouble}; last reply: {completion.text[:REPLY_EXCERPT_CHARS]!r}"
        )


def _said(text: str) -> str:
    """What a reply says, whatever its spacing: its JSON object written one way, else its words."""
    value = parse_json_object(text)
    if value is not None:
        return json.dumps(value, sort_keys=True, ensure_ascii=False)
    return " ".join(text.split())


def _record(settings: Settings, exchange: Exchange, question: Question) -> None:
    """One `agent_calls` row: what the call cost, about which video or batch (valid or not). Bookkeeping: a
    database that is away loses the row (logged), never the call's reply or its own error."""
    try:
        _insert_call(settings, exchange, question)
    except sa.exc.SQLAlchemyError as exc:
        log.warning("llm %s %s: its cost was not recorded: %s", exchange.agent, exchange.task, exc)


def _insert_call(settings: Settings, exchange: Exchange, question: Question) -> None:
    with session_scope(settings) as session:
        session.add(
            AgentCall(
                agent=exchange.agent,
                task=exchange.task,
                video_id=question.video_id,
                batch_id=question.batch_id,
                tries=exchange.tries,
                valid=exchange.valid,
                seconds=exchange.seconds,
                prompt_tokens=exchange.prompt_tokens,
                cached_tokens=exchange.cached_tokens,
                completion_tokens=exchange.completion_tokens,
            )
        )


def _validated(question: Question[Reply], text: str) -> tuple[Reply | None, str]:
    """The reply as the question's model, or None and what is wrong with it."""
    value = parse_json_object(text)
    if value is None:
        return None, "no JSON object" if text.strip() else "an empty reply"
    try:
        return question.reply.model_validate(value, context=question.context), ""
    except ValidationError as error:
        return None, problem(error)
