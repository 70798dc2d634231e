"""What an llm agent sees on each call: the seed's three memory tiers, compiled by the studio.

- Core memory: the six shared blocks, as JSON, and memory statistics (how many archival passages and past
  messages exist and what they cover), as the seed's agents saw them.
- Recall memory: the conversation's running summary and live message buffer from Postgres
  (`mas.memory.recall`), as many of the newest as fit `MAS_LLM_CONTEXT_CHARS`; eviction and maintenance v3
  bound the buffer itself.

The order is the prefix caches' (vLLM, llama.cpp, hosted APIs reuse the longest prompt prefix they saw):
the system prompt holds what rarely changes (protocol, the blocks outside `CHANGING`, persona); then the
summary and messages, which only grow until an eviction; the blocks every step rewrites and the statistics
come last, in the call's own message (`changing_memory`). Where the history starts moves in steps of
`HISTORY_STRIDE` messages, not message by message, so consecutive calls share it.
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
from mas.domain.identity import Actor
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

CHANGING = ("session_state", "production_queue")
"""Core blocks rewritten by nearly every step: sent last, after the history, so they break no cached prefix."""

HISTORY_STRIDE = 8
"""The history sent starts at a multiple of this many messages into the live buffer."""


STUDIO = "You work in an autonomous AI video studio."
"""The opening every role shares, so that what follows it (protocol, core blocks) is a prefix they share."""


def system_prompt(settings: Settings, actor: Actor, agent: str) -> str:
    """The protocol and the core blocks that rarely change, which every role shares, then the agent's
    persona: a server that caches one prompt (llama.cpp's) reuses the shared part from call to call
    whichever role asks, one that caches many (vLLM, hosted APIs) the whole of it."""
    core = _blocks(settings, actor, stable=True)
    if recall.is_sleeptime(agent):
        return f"{SLEEPTIME_PERSONA}{SLEEPTIME_PROTOCOL}\n\n# Core memory\n{core}"
    return f"{STUDIO}{PROTOCOL}\n\n# Core memory\n{core}\n\n# Your role\n{PERSONAS[recall.agent_of(agent)]}"


def changing_memory(settings: Settings, actor: Actor, conversation: str) -> str:
    """The core blocks every step rewrites and the memory statistics, as of this call."""
    return (
        f"# Core memory, now\n{_blocks(settings, actor, stable=False)}\n\n"
        f"# Memory statistics\n{memory_statistics(settings, conversation)}"
    )


def _blocks(settings: Settings, actor: Actor, *, stable: bool) -> str:
    return "\n".join(
        f"<{label}>{json.dumps(value, ensure_ascii=False, separators=(',', ':'))}</{label}>"
        for label, value in blocks.read_all(settings, actor).items()
        if (label not in CHANGING) == stable
    )


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
    """The running summary and the live messages from the earliest stride start whose messages fit
    `MAS_LLM_CONTEXT_CHARS`, oldest first."""
    remembered = recall.context(settings, agent)
    budget = settings.llm.context_chars
    summary = remembered.summary[: budget // 3]
    budget -= len(summary)
    contents = [m.content[:MESSAGE_MAX_CHARS] for m in remembered.messages]
    start = len(contents)
    while start > 0 and len(contents[start - 1]) <= budget:  # the newest that fit, back from the end
        start -= 1
        budget -= len(contents[start])
    stride_start = start + -start % HISTORY_STRIDE  # rounded up to the stride: the same start for many calls
    start = stride_start if stride_start < len(contents) else start
    kept = [
        {"role": "assistant" if m.role == "assistant" else "user", "content": content}
        for m, content in zip(remembered.messages[start:], contents[start:], strict=True)
    ]
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
