"""One llm agent: a role's question sent with its memory, the reply validated, corrected, remembered.

A call holds the agent (`mas.agents.serial`), so one agent's conversation never interleaves; different
agents run in parallel across cpu workers. A reply that does not validate is shown its validation error
and asked again, `MAS_LLM_REPLY_RETRIES` times, then the step fails with the reason (`LLMReplyError`,
permanent: the batch or video records it). Only a validated exchange enters the agent's recall buffer,
so a failed call leaves its memory as it was.
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import nullcontext
from dataclasses import dataclass

from pydantic import BaseModel, ValidationError

from mas.agents.llm.client import complete
from mas.agents.llm.context import alternating, conversation, system_prompt
from mas.agents.llm.errors import LLMReplyError
from mas.agents.protocol import Question
from mas.agents.replies import parse_json_object, problem
from mas.agents.serial import agent_turn
from mas.config import Settings
from mas.memory import recall

log = logging.getLogger(__name__)

REPLY_EXCERPT_CHARS = 200
"""How much of a bad reply an error quotes."""


@dataclass(frozen=True, kw_only=True)
class Exchange:
    """What one call cost and how it went (the benchmark and the logs read it)."""

    agent: str
    task: str
    tries: int
    seconds: float
    prompt_tokens: int
    completion_tokens: int
    mode: str


class LLMAgent:
    """An `Asker` over an OpenAI-compatible endpoint, with the studio's memory as the agent's memory.

    `history=False` sends no recalled messages (the sleeptime agent, which starts every run clear).
    `serialize=False` skips the per-agent lock, for callers with no studio database to hold it in.
    """

    def __init__(self, settings: Settings, agent: str, *, history: bool = True, serialize: bool = True) -> None:
        self.settings, self.agent, self.history, self.serialize = settings, agent, history, serialize
        self.last: Exchange | None = None

    def ask(self, question: Question) -> BaseModel:
        with agent_turn(self.settings, self.agent) if self.serialize else nullcontext():
            reply, text = self._answer(question)
            recall.append(self.settings, self.agent, role="user", content=question.message())
            recall.append(self.settings, self.agent, role="assistant", content=text)
        return reply

    def _answer(self, question: Question) -> tuple[BaseModel, str]:
        messages = [{"role": "system", "content": system_prompt(self.settings, self.agent)}]
        if self.history:
            messages += conversation(self.settings, self.agent)
        messages.append({"role": "user", "content": question.message()})
        schema = question.schema()
        prompt_tokens = completion_tokens = 0
        started = time.monotonic()
        for attempt in range(1, self.settings.llm_reply_retries + 2):
            completion = complete(self.settings, alternating(messages), schema=schema, name=question.task)
            prompt_tokens += completion.prompt_tokens
            completion_tokens += completion.completion_tokens
            self.last = Exchange(
                agent=self.agent,
                task=question.task,
                tries=attempt,
                seconds=time.monotonic() - started,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                mode=completion.mode,
            )
            reply, trouble = _validated(question, completion.text)
            if reply is None and completion.truncated:
                trouble = f"the reply was cut at {self.settings.llm_max_tokens} tokens (MAS_LLM_MAX_TOKENS); be brief"
            if reply is not None:
                log.info(
                    "llm %s %s: valid reply after %d tries in %.2f s (%d+%d tokens, %s)",
                    self.agent,
                    question.task,
                    attempt,
                    self.last.seconds,
                    prompt_tokens,
                    completion_tokens,
                    completion.mode,
                )
                return reply, json.dumps(reply.model_dump(), ensure_ascii=False)
            log.warning("llm %s %s: reply %d invalid: %s", self.agent, question.task, attempt, trouble)
            messages += [
                {"role": "assistant", "content": completion.text[: REPLY_EXCERPT_CHARS * 10]},
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


def _validated(question: Question, text: str) -> tuple[BaseModel | None, str]:
    """The reply as the question's model, or None and what is wrong with it."""
    value = parse_json_object(text)
    if value is None:
        return None, "no JSON object" if text.strip() else "an empty reply"
    try:
        return question.reply.model_validate(value, context=question.context), ""
    except ValidationError as error:
        return None, problem(error)
