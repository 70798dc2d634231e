"""What an llm agent sees on each call: the seed's three memory tiers, compiled by the studio.

- Core memory: the six shared blocks, as JSON, in the system prompt, followed by memory statistics (how
  many archival passages and past messages exist and what they cover), as the seed's agents saw them.
- Recall memory: the agent's running summary and live message buffer from Postgres (`mas.memory.recall`),
  newest first until `MAS_LLM_CONTEXT_CHARS`; eviction and maintenance v3 bound the buffer itself.
- Archival memory is retrieved before the call by the studio (the Writer's brief carries the nearest
  successes and failures), not searched by the model with a tool: the studio knows what each task needs,
  one round trip is cheaper than a tool loop, and small models call tools unreliably.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from mas.agents.protocol import PERSONAS, PROTOCOL
from mas.config import Settings
from mas.memory import blocks, recall
from mas.memory.archival import ArchivalMemory

SLEEPTIME_PERSONA = (
    "You are the sleeptime memory agent of an AI video studio. Between productions you review what the "
    "studio produced and distil it: a short summary of the activity and at most three reusable lessons "
    "about what made prompts succeed or fail."
)

SLEEPTIME_PROTOCOL = (
    "\n\nEach message is a task in the lines `TASK`, `INPUT <json>`, `REPLY <json shape>` and `RULES`. "
    "Answer with exactly one JSON object of the REPLY shape and nothing else."
)

MESSAGE_MAX_CHARS = 2000
"""Longest single recalled message sent back to the model (longer ones are cut, the rest is in recall)."""


def system_prompt(settings: Settings, agent: str) -> str:
    """The agent's persona and protocol, its core memory blocks and its memory statistics."""
    if recall.is_sleeptime(agent):
        head = SLEEPTIME_PERSONA + SLEEPTIME_PROTOCOL
    else:
        head = PERSONAS[agent] + PROTOCOL
    core = "\n".join(
        f"<{label}>{json.dumps(value, ensure_ascii=False, separators=(',', ':'))}</{label}>"
        for label, value in blocks.read_all(settings).items()
    )
    return f"{head}\n\n# Core memory\n{core}\n\n# Memory statistics\n{memory_statistics(settings, agent)}"


def memory_statistics(settings: Settings, agent: str) -> str:
    """How much archival and recall memory exists beyond the context, and what it covers."""
    archive = ArchivalMemory(settings).stats()
    tags = ", ".join(f"{n} {tag}" for tag, n in list(archive.per_tag.items())[:6]) or "none"
    mine = recall.stats(settings, agent)
    return (
        f"- archival memory: {archive.total} passages ({tags}){_span(archive.oldest, archive.newest)}; the "
        "studio retrieves the relevant ones into each task's INPUT.\n"
        f"- recall memory: {mine.total} past messages of yours{_span(mine.oldest, mine.newest)}, "
        f"{mine.live} of them in your buffer; older ones are in the summary below."
    )


def conversation(settings: Settings, agent: str) -> list[dict[str, Any]]:
    """The running summary and the newest live messages that fit `MAS_LLM_CONTEXT_CHARS`, oldest first."""
    remembered = recall.context(settings, agent)
    budget = settings.llm_context_chars
    kept: list[dict[str, Any]] = []
    summary = remembered.summary[: budget // 3]
    budget -= len(summary)
    for message in reversed(remembered.messages):
        content = message.content[:MESSAGE_MAX_CHARS]
        if len(content) > budget:
            break
        budget -= len(content)
        kept.append({"role": "assistant" if message.role == "assistant" else "user", "content": content})
    kept.reverse()
    if summary:
        kept.insert(0, {"role": "user", "content": f"(Summary of your earlier messages: {summary})"})
    elif kept and kept[0]["role"] == "assistant":
        kept.insert(0, {"role": "user", "content": "(Your earlier messages follow.)"})
    return kept


def alternating(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive messages of one role merged: many chat templates insist on user/assistant turns."""
    merged: list[dict[str, Any]] = []
    for message in messages:
        if merged and merged[-1]["role"] == message["role"]:
            merged[-1] = {**merged[-1], "content": merged[-1]["content"] + "\n" + message["content"]}
        else:
            merged.append(message)
    return merged


def _span(oldest: datetime | None, newest: datetime | None) -> str:
    if oldest is None or newest is None:
        return ""
    return f", from {oldest:%Y-%m-%d %H:%M} to {newest:%Y-%m-%d %H:%M} UTC"
