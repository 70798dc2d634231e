"""Reading an agent's answer: the JSON object it sent, and its fields as the roles want them.

A sleeptime-enabled agent answers with a `send_message` tool call, a plain agent with an assistant
message; models also wrap JSON in code fences or prose, send a list where a string is wanted, or one
string for a list. Anything that cannot be read as asked is a `LettaReplyError` (retryable: the next
answer may be better).
"""

from __future__ import annotations

import json
import re
from typing import Any

from mas.agents.letta.errors import LettaReplyError

SEND_MESSAGE = "send_message"

REPLY_EXCERPT_CHARS = 300
"""How much of an unparseable reply an error message quotes."""

VALUE_EXCERPT_CHARS = 200
"""How much of a field of the wrong type an error message quotes."""

_FENCE = re.compile(r"^```[a-zA-Z]*\s*|\s*```$")


def reply_candidates(response) -> list[str]:
    """The texts an agent's answer may be in, in order: assistant messages and send_message arguments."""
    found: list[str] = []
    for message in getattr(response, "messages", None) or []:
        kind = getattr(message, "message_type", "")
        if kind == "assistant_message":
            content = message.content
            if isinstance(content, str):
                found.append(content)
            else:
                found.append("".join(getattr(part, "text", "") or "" for part in content or []))
        elif kind == "tool_call_message":
            calls = list(getattr(message, "tool_calls", None) or []) or [message.tool_call]
            for call in calls:
                if call is None or getattr(call, "name", None) != SEND_MESSAGE:
                    continue
                try:
                    arguments = json.loads(call.arguments or "{}")
                except json.JSONDecodeError:
                    found.append(call.arguments or "")
                    continue
                text = arguments.get("message", "") if isinstance(arguments, dict) else arguments
                found.append(text if isinstance(text, str) else json.dumps(text))
    return found


def parse_json_object(text: str) -> dict[str, Any] | None:
    """The JSON object in `text`: the whole text, a fenced block, or the first object embedded in prose."""
    text = text.strip()
    candidates = [text, _FENCE.sub("", text).strip()]
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
        if isinstance(value, str):  # a JSON string holding the object (double-encoded)
            inner = parse_json_object(value) if value.strip().startswith("{") else None
            if inner is not None:
                return inner
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return None


def reply_object(response, *, agent: str, task: str) -> dict[str, Any]:
    """The last JSON object in the agent's answer, or LettaReplyError quoting what it said instead."""
    candidates = reply_candidates(response)
    for candidate in reversed(candidates):
        value = parse_json_object(candidate)
        if value is not None:
            return value
    stop = getattr(getattr(response, "stop_reason", None), "stop_reason", None)
    raw = " | ".join(c for c in candidates if c.strip())
    problem = "no JSON object" if raw else f"no reply (stop reason: {stop or 'unknown'})"
    raise LettaReplyError(agent=agent, task=task, problem=problem, excerpt=raw[:REPLY_EXCERPT_CHARS])


class ReplyFields:
    """Reads the fields of one reply, naming the agent and task in any error."""

    def __init__(self, value: dict[str, Any], *, agent: str, task: str) -> None:
        self.value, self.agent, self.task = value, agent, task

    def problem(self, problem: str, excerpt: Any = None) -> LettaReplyError:
        """The error for a reply of the wrong shape (the caller raises it)."""
        quoted = json.dumps(excerpt)[:VALUE_EXCERPT_CHARS] if excerpt is not None else ""
        return LettaReplyError(agent=self.agent, task=self.task, problem=problem, excerpt=quoted)

    def text(self, name: str, *, required: bool = False) -> str:
        """A text field; a list of words becomes one comma-separated text."""
        value = self.value.get(name)
        if value is None:
            value = ""
        if isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value):
            value = ", ".join(str(v) for v in value)
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise self.problem(f"{name!r} is not text", value)
        value = str(value).strip()
        if required and not value:
            raise self.problem(f"an empty {name!r}")
        return value

    def texts(self, name: str) -> list[str]:
        """A list-of-text field; one text becomes a list of one."""
        value = self.value.get(name)
        if value is None:
            return []
        if isinstance(value, str):
            return [value.strip()] if value.strip() else []
        if not isinstance(value, list) or not all(isinstance(v, (str, int, float)) for v in value):
            raise self.problem(f"{name!r} is not a list of text", value)
        return [str(v).strip() for v in value if str(v).strip()]
