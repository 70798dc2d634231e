"""What the model-backed agents are told: personas, the task protocol, and one `Question` per role task.

Every role call is one message in the protocol below (TASK, INPUT, REPLY, RULES), answered by one JSON
object that a pydantic model of `mas.agents.replies` validates. The Letta and the llm backends send the
same questions; only the transport differs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

PERSONAS = {
    "director": (
        "You are the Director of an autonomous AI video studio. You plan production batches, content "
        "series and A/B tests, read what users say about the style they like, and consolidate recent "
        "production activity into a short summary and reusable learnings."
    ),
    "writer": (
        "You are the Writer of an autonomous AI video studio. You write prompts for a text-to-video model "
        "(LTX-2): one vivid sentence or short paragraph naming subject, action, camera, lighting, colour "
        "palette and atmosphere. You apply the user's learned style, the series' rules and winning "
        "patterns, you prevent known failure patterns, and you never include anything the user dislikes."
    ),
    "cameraman": (
        "You are the Cameraman of an autonomous AI video studio. You judge each rendered attempt from its "
        "grade and quality scores: accept it when the grade meets the minimum; otherwise name what failed "
        "and either ask for a refinement with a concrete strategy, or give up when attempts are used up."
    ),
}

PROTOCOL = (
    "\n\nYour core memory holds the studio's shared memory blocks, each a JSON object: session_state, "
    "user_style, quality_standards, production_queue, current_series and ab_testing. Read them; the "
    "studio writes them.\n"
    "Every message you receive is a task in three lines: `TASK <name>`, `INPUT <json>` and "
    "`REPLY <json shape>`, sometimes followed by `RULES`. Answer with exactly one JSON object of the "
    "REPLY shape and nothing else (no prose, no code fence), sent with send_message when you have that "
    "tool, otherwise as your reply."
)


def system_prompt(role: str) -> str:
    """The system prompt of a role's agent: its persona, then the task protocol."""
    return PERSONAS[role] + PROTOCOL


WRITE_TOKENS = 400
"""Most tokens of a `write` reply: a prompt of about 200 words and its negative prompt. A small model that
rambles inside a string runs to the cap; a cap that fits the reply ends that try early, and the reply is
seen as cut (not as "no JSON object") and asked again briefly."""

REVIEW_TOKENS = 200
"""Most tokens of a `review` reply: an action, a few short reasons and a strategy."""

STYLE_TOKENS = 160
TRANSLATE_TOKENS = 120
"""Most tokens of a `read_style` reply: a few words per aspect and a few dislikes."""

PLAN_TOKENS, PLAN_TOKENS_PER_VIDEO = 200, 60
"""Most tokens of a `plan` reply: the series' style and rules, then a concept and approach per video."""

CONSOLIDATE_TOKENS = 300
"""Most tokens of a `consolidate` reply: a summary and three learnings."""


Reply = TypeVar("Reply", bound=BaseModel)


@dataclass(frozen=True, kw_only=True)
class Question(Generic[Reply]):
    """One role task: what is sent, the reply shape in words, and the model that validates the reply (an
    asker returns an instance of it: `ask(Question[PlanReply]) -> PlanReply`)."""

    task: str
    payload: dict[str, Any]
    shape: str  # the REPLY line: the JSON shape in words a model reads easily
    reply: type[Reply]
    rules: str = ""
    context: dict[str, Any] = field(default_factory=dict)  # validation context (e.g. how many videos)
    video_id: int | None = None  # what the call is about: its cost is counted there, its conversation
    batch_id: int | None = None  # is the one this video (or batch) used before when that one is free
    max_tokens: int | None = None  # most tokens the reply may take (fits its shape); None: MAS_LLM_MAX_TOKENS
    alone: bool = False
    """A task about its input alone (reading one feedback): asked without the conversation's earlier
    messages, which a small model hands back as its answer ("surprise me!" read as the last feedback). Its
    exchange is still remembered. A Letta agent keeps its own history."""

    def message(self) -> str:
        """The text of the call: TASK, INPUT (JSON), REPLY (the shape wanted), RULES."""
        return task_message(self.task, self.payload, self.shape, self.rules)

    def schema(self) -> dict[str, Any]:
        """The reply's JSON schema for the endpoint, with list lengths pinned where the context fixes them.

        Maximum string lengths are left out: llama.cpp turns `maxLength` into one nested grammar rule per
        character and refuses long ones (its server then died, in 0.3.36); the studio checks lengths itself,
        and MAS_LLM_MAX_TOKENS bounds a reply.
        """
        schema = _without_string_lengths(self.reply.model_json_schema())
        count = self.context.get("count")
        if count is not None:
            for name in ("videos", "candidates"):
                prop = schema.get("properties", {}).get(name)
                if prop is not None:
                    prop.update(minItems=count, maxItems=count)
                    schema.setdefault("required", [])
                    if name not in schema["required"]:
                        schema["required"].append(name)
        return schema


def _without_string_lengths(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _without_string_lengths(v) for k, v in schema.items() if k != "maxLength"}
    if isinstance(schema, list):
        return [_without_string_lengths(v) for v in schema]
    return schema


def task_message(task: str, payload: dict[str, Any], reply: str, rules: str = "") -> str:
    """The text of one role call: TASK, INPUT (JSON), REPLY (the JSON shape wanted), RULES."""
    lines = [f"TASK {task}", f"INPUT {json.dumps(payload, ensure_ascii=False, default=str)}", f"REPLY {reply}"]
    if rules:
        lines.append(f"RULES {rules}")
    return "\n".join(lines)
