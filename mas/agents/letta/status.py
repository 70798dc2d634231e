"""What `mas letta status` shows, and the health check maintenance runs first: looks only, changes nothing."""

from __future__ import annotations

from dataclasses import dataclass, field

from mas.agents.letta.client import client, translated
from mas.agents.letta.errors import LettaError
from mas.agents.letta.server import (
    blocks_by_label,
    crew_conversations,
    find_agent,
    in_context,
    sleeptime_frequency,
    sleeptime_group,
)
from mas.config import Settings
from mas.domain.identity import Actor
from mas.memory.blocks import SCHEMAS
from mas.redaction import redact_url

HEALTH_TIMEOUT_S = 10.0


@dataclass(frozen=True, kw_only=True)
class Health:
    """Whether the server answers, which version it runs, and whether it accepts our token."""

    ok: bool
    version: str | None = None
    detail: str = ""


def health(settings: Settings, *, api=None) -> Health:
    """GET /v1/health/, then one authenticated call (the health route needs no token)."""
    api = (api or client(settings)).with_options(timeout=HEALTH_TIMEOUT_S, max_retries=0)
    try:
        with translated("health check"):
            answer = api.health()
        with translated("listing agents"):
            api.agents.list(limit=1)
    except LettaError as exc:
        return Health(ok=False, detail=str(exc))
    return Health(ok=answer.status == "ok", version=answer.version, detail=answer.status)


@dataclass(frozen=True, kw_only=True)
class CompanionStatus:
    name: str
    id: str
    in_context: int
    autoclear: bool


@dataclass(frozen=True, kw_only=True)
class AgentStatus:
    role: str
    id: str | None
    model: str | None = None
    in_context: int | None = None
    sleeptime_frequency: int | None = None
    group_id: str | None = None
    companions: list[CompanionStatus] = field(default_factory=list)
    block_ids: dict[str, str] = field(default_factory=dict)  # attached mas blocks, label -> id
    problems: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class LettaStatus:
    """Server, shared blocks, and each agent."""

    url: str
    healthy: bool
    version: str | None
    blocks: dict[str, str | None]  # label -> block id (None: missing)
    agents: list[AgentStatus]
    error: str | None = None

    @property
    def provisioned(self) -> bool:
        return self.healthy and all(self.blocks.values()) and all(a.id and not a.problems for a in self.agents)


def status(settings: Settings, actor: Actor, *, api=None) -> LettaStatus:
    """Server health, shared block ids, and per agent: id, in-context messages, sleeptime frequency and
    companions (with their autoclear flag). Provisions nothing."""
    api = api or client(settings)
    url = redact_url(settings.letta.url) or ""
    state = health(settings, api=api)
    if not state.ok:
        return LettaStatus(url=url, healthy=False, version=state.version, blocks={}, agents=[], error=state.detail)
    blocks = {label: (found[0].id if found else None) for label, found in blocks_by_label(api, user=actor.user).items()}
    agents = [_agent_status(settings, actor, api, talk, blocks) for talk in crew_conversations(settings)]
    return LettaStatus(url=url, healthy=True, version=state.version, blocks=blocks, agents=agents)


def _agent_status(settings: Settings, actor: Actor, api, role: str, blocks: dict[str, str | None]) -> AgentStatus:
    agent = find_agent(api, role, user=actor.user)
    if agent is None:
        return AgentStatus(role=role, id=None, problems=["missing: run `mas letta provision`"])
    problems = []
    attached = {b.label: b.id for b in (agent.blocks or []) if b.label in SCHEMAS}
    for label, block_id in blocks.items():
        if block_id and attached.get(label) != block_id:
            problems.append(f"block {label} not attached")
    group = sleeptime_group(agent)
    companions = []
    frequency = None
    if group is None:
        problems.append("sleeptime disabled")
    else:
        frequency = sleeptime_frequency(api, group.id)
        if frequency != settings.memory.sleeptime_frequency:
            problems.append(f"sleeptime frequency {frequency}, settings say {settings.memory.sleeptime_frequency}")
        for sleeptime_id in group.agent_ids:
            with translated(f"reading sleeptime agent of {role}"):
                companion = api.agents.retrieve(sleeptime_id)
            companions.append(
                CompanionStatus(
                    name=companion.name,
                    id=companion.id,
                    in_context=len(companion.message_ids or []),
                    autoclear=bool(companion.message_buffer_autoclear),
                )
            )
            if not companion.message_buffer_autoclear:
                problems.append(f"{companion.name}: autoclear off")
    return AgentStatus(
        role=role,
        id=agent.id,
        model=getattr(agent.llm_config, "handle", None) or getattr(agent, "model", None),
        in_context=in_context(api, agent.id),
        sleeptime_frequency=frequency,
        group_id=group.id if group else None,
        companions=companions,
        block_ids=attached,
        problems=problems,
    )
