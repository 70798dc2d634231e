"""Reading a Letta agent's answer: the JSON object it sent (validated afterwards by `mas.agents.replies`).

A sleeptime-enabled agent answers with a `send_message` tool call, a plain agent with an assistant
message; models also wrap JSON in code fences or prose, send a list where a string is wanted, or one
string for a list. Anything that cannot be read as asked is a `LettaReplyError` (retryable: the next
answer may be better).
"""

from __future__ import annotations

import json
from typing import Any

from mas.agents.letta.errors import LettaReplyError
from mas.agents.replies import parse_json_object

SEND_MESSAGE = "send_message"

REPLY_EXCERPT_CHARS = 300
"""How much of an unparseable reply an error message quotes."""


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
