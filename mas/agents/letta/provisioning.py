"""Provisioning: a user's crew on the Letta server, its six core blocks and three sleeptime-enabled agents.

What lives on the server, found by name and the tag `mas` (never by a stored id; `mas.agents.letta.server`),
created when missing:

- six core blocks, one per label of `mas.memory.blocks.SCHEMAS`, each holding its value as JSON
  (Appendix B defaults): the studio's shared ones, the same block ids attached to every crew, and the
  taste blocks (`PER_USER`), the user's own;
- MAS_AGENT_CONVERSATIONS agents for each of `director`, `writer` and `cameraman` (`writer`, `writer.1`,
  ...: the role's conversations, `mas.agents.conversations`; for a named user, tagged as theirs), all
  sharing the same core blocks, with sleeptime enabled: Letta gives each a sleeptime companion (`<name>-sleeptime`) in a group that runs it
  every MAS_SLEEPTIME_FREQUENCY turns;
  the companions get `message_buffer_autoclear` (the seed system's finding: accumulated history made
  them ignore their instructions), and instructions to keep the JSON blocks valid.

`provision` is idempotent and serialized across processes by an advisory lock in the studio's own
database; a second run creates nothing and only repairs what drifted (a detached block, sleeptime off,
autoclear off, another frequency).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol, cast

from mas import db, locks, names
from mas.agents.letta.client import client, translated
from mas.agents.letta.errors import LettaRejected
from mas.agents.letta.prompts import SLEEPTIME_PERSONA, SLEEPTIME_PERSONA_LABEL
from mas.agents.letta.server import (
    TAG,
    agent_name,
    agent_tags,
    block_tags,
    block_text,
    blocks_by_label,
    crew_conversations,
    find_agent,
    letta_name,
    set_sleeptime_frequency,
    sleeptime_group,
)
from mas.agents.protocol import system_prompt
from mas.config import Settings
from mas.domain.identity import Actor
from mas.memory import recall
from mas.memory.blocks import defaults
from mas.singletons import per_process

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class AgentIds:
    """One provisioned agent (a conversation of a role) and its sleeptime companions."""

    conversation: str
    id: str
    group_id: str | None
    sleeptime_ids: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Provisioned:
    """What is on the server now, and what this call created or repaired."""

    blocks: dict[str, str]  # label -> block id
    agents: dict[str, AgentIds]  # conversation (writer, writer.1, ...) -> ids
    created: list[str] = field(default_factory=list)  # "block user_style", "agent director"
    changed: list[str] = field(default_factory=list)  # "director: attached block ab_testing", ...


def _ids(conversation: str, agent) -> AgentIds:
    group = sleeptime_group(agent)
    return AgentIds(
        conversation=conversation,
        id=agent.id,
        group_id=group.id if group else None,
        sleeptime_ids=tuple(group.agent_ids) if group else (),
    )


def find(settings: Settings, actor: Actor, *, api=None) -> Provisioned | None:
    """What is provisioned for `actor.user`, found by name and tag; None if any block or agent is missing."""
    api = api or client(settings)
    blocks = blocks_by_label(api, user=actor.user)
    if any(not found for found in blocks.values()):
        return None
    agents = {}
    for conversation in crew_conversations(settings):
        agent = find_agent(api, conversation, user=actor.user)
        if agent is None or not sleeptime_group(agent):
            return None
        agents[conversation] = _ids(conversation, agent)
    return Provisioned(blocks={label: found[0].id for label, found in blocks.items()}, agents=agents)


def provision(settings: Settings, actor: Actor, *, api=None, lock: bool = True) -> Provisioned:
    """Create what is missing of `actor`'s crew and repair what drifted; the same result, and
    nothing new, when run again.

    `lock` serializes concurrent provisioning (say two workers starting at once) on an advisory lock in
    the studio's PostgreSQL; pass False where no studio database is reachable.
    """
    api = api or client(settings)
    if lock:
        with locks.held(db.ready_engine(settings), names.LETTA_PROVISION_LOCK):
            return _provision(settings, actor, api)
    return _provision(settings, actor, api)


def _provision(settings: Settings, actor: Actor, api) -> Provisioned:
    created: list[str] = []
    changed: list[str] = []
    blocks: dict[str, str] = {}
    for label, found in blocks_by_label(api, user=actor.user).items():
        if found:
            if len(found) > 1:
                log.warning("%d Letta blocks labelled %r carry tag %r; using %s", len(found), label, TAG, found[0].id)
            blocks[label] = found[0].id
            continue
        with translated(f"creating block {label}"):
            block = api.blocks.create(
                label=label,
                value=block_text(defaults(label, settings)),
                limit=settings.memory.core_block_max_chars,
                tags=block_tags(label, actor.user),
                description=f"{label}: one JSON object (Appendix B schema); keep it valid JSON.",
            )
        blocks[label] = block.id
        created.append(f"block {label}")
        log.info("created Letta block %s (%s)", label, block.id)

    agents: dict[str, AgentIds] = {}
    for conversation in crew_conversations(settings):
        name = agent_name(conversation, actor.user)
        agent = find_agent(api, conversation, user=actor.user)
        fresh = agent is None
        if fresh:
            with translated(f"creating agent {name}"):
                agent = api.agents.create(
                    name=letta_name(conversation, actor.user),
                    model=settings.letta.model,
                    embedding=settings.letta.embedding,
                    system=system_prompt(recall.agent_of(conversation)),
                    block_ids=list(blocks.values()),
                    tags=agent_tags(recall.agent_of(conversation), actor.user),
                    enable_sleeptime=True,
                    description=f"mas {name}",
                )
            created.append(f"agent {name}")
            log.info("created Letta agent %s (%s)", name, agent.id)
            agent = find_agent(api, conversation, user=actor.user) or agent
        # a new agent's companion is set up here too; that is part of creating it, not a repair
        agents[conversation] = _repair(settings, actor, api, conversation, agent, blocks, [] if fresh else changed)
    return Provisioned(blocks=blocks, agents=agents, created=created, changed=changed)


def _repair(
    settings: Settings, actor: Actor, api, conversation: str, agent, blocks: dict[str, str], changed: list[str]
) -> AgentIds:
    """Bring one found agent to the wanted state; note each change."""
    name = agent_name(conversation, actor.user)
    attached = {b.id for b in (agent.blocks or [])}
    for label, block_id in blocks.items():
        if block_id not in attached:
            with translated(f"attaching block {label} to {name}"):
                api.agents.blocks.attach(block_id, agent_id=agent.id)
            changed.append(f"{name}: attached block {label}")
    group = sleeptime_group(agent)
    if not group:
        with translated(f"enabling sleeptime on {name}"):
            api.agents.update(agent.id, enable_sleeptime=True)
        changed.append(f"{name}: enabled sleeptime")
        agent = find_agent(api, conversation, user=actor.user)
        group = sleeptime_group(agent) if agent is not None else None
        if not group:
            raise LettaRejected(f"enabling sleeptime on {name} made no sleeptime group")
    if group.sleeptime_agent_frequency != settings.memory.sleeptime_frequency:
        set_sleeptime_frequency(api, group.id, settings.memory.sleeptime_frequency)
        changed.append(
            f"{name}: sleeptime frequency {group.sleeptime_agent_frequency} -> {settings.memory.sleeptime_frequency}"
        )
    for sleeptime_id in group.agent_ids:
        _repair_companion(api, name, sleeptime_id, blocks, changed)
    return _ids(conversation, agent)


def _repair_companion(api, name: str, sleeptime_id: str, blocks: dict[str, str], changed: list[str]) -> None:
    """Autoclear on, every shared block attached, the studio's instructions in its persona."""
    with translated(f"reading sleeptime agent of {name}"):
        companion = api.agents.retrieve(sleeptime_id, include=["agent.blocks"])
    if not companion.message_buffer_autoclear:
        with translated(f"enabling autoclear on {companion.name}"):
            api.agents.update(sleeptime_id, message_buffer_autoclear=True)
        changed.append(f"{companion.name}: message_buffer_autoclear on")
    companion_blocks = {b.label: b for b in (companion.blocks or [])}
    for label, block_id in blocks.items():
        if label not in companion_blocks:
            with translated(f"attaching block {label} to {companion.name}"):
                api.agents.blocks.attach(block_id, agent_id=sleeptime_id)
            changed.append(f"{companion.name}: attached block {label}")
    persona = companion_blocks.get(SLEEPTIME_PERSONA_LABEL)
    if persona is not None and persona.value != SLEEPTIME_PERSONA:
        with translated(f"instructing {companion.name}"):
            api.agents.blocks.update(SLEEPTIME_PERSONA_LABEL, agent_id=sleeptime_id, value=SLEEPTIME_PERSONA)
        changed.append(f"{companion.name}: instructions set")


# --- the crew a process talks to -----------------------------------------------------------------------


class _Forgettable(Protocol):
    """What `per_process` adds to the function it decorates (its return type does not say so)."""

    def forget(self) -> None: ...


@per_process(key=lambda settings, actor: (settings.letta.url, actor.user))
def _known_crew(settings: Settings, actor: Actor) -> Provisioned:
    api = client(settings)
    return find(settings, actor, api=api) or provision(settings, actor, api=api)


def crew(settings: Settings, actor: Actor, *, refresh: bool = False) -> Provisioned:
    """`actor`'s provisioned ids on this server, looked up once per process (provisioned if missing).

    `refresh` looks them up again: for a caller that found an agent or block gone from the server.
    """
    if refresh:
        cast(_Forgettable, _known_crew).forget()
    return _known_crew(settings, actor)


def forget() -> None:
    """Drop the ids this process looked up, so the next call looks them up again."""
    cast(_Forgettable, _known_crew).forget()
