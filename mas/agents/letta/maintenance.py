"""Message-buffer maintenance of the Letta agents: the seed's `letta_maintenance_v3.py` cron, as a function.

The studio's one buffer policy (`mas.memory.buffer_policy`, also applied to the Postgres buffers by
`mas.memory.recall.maintain`) decides; this module carries it out on each Letta agent's in-context
messages (`len(agent.message_ids)`), primary agents and sleeptime companions alike: a summary is Letta's
compaction, a reset clears the messages.

Failed compactions are counted in the agent's own metadata on the server (`mas_failed_compactions`), so
the count survives worker restarts without a state file; a success or a reset sets it back to 0. Letta
refuses to compact a short history (HTTP 400); that counts as a failure like any other.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext

from mas.agents import conversations
from mas.agents.letta.client import client, translated
from mas.agents.letta.errors import LettaError, LettaUnavailable
from mas.agents.letta.server import ROLES, in_context, role_agents, sleeptime_group
from mas.agents.letta.status import health
from mas.config import Settings
from mas.locks import LockTimeout
from mas.memory import buffer_policy
from mas.memory.buffer_policy import Action, Decision

log = logging.getLogger(__name__)

COMPACT_TIMEOUT_S = 300.0
"""Longest one compaction (an LLM summary of the evicted messages) may take."""

FAILED_COMPACTIONS_KEY = "mas_failed_compactions"
"""Agent metadata key where maintenance counts failed compactions (state kept on the server)."""


def targets(api) -> tuple[dict[str, str], dict[str, str]]:
    """Every agent to maintain, every user's crew: (primary agents, sleeptime companions), each by the name
    recall uses -> id: director, director@alice, ..., and director_sleeptime, director@alice_sleeptime, ..."""
    found: dict[str, str] = {}
    companions: dict[str, str] = {}
    for role in ROLES:
        agents = role_agents(api, role)
        if not agents:
            log.warning("maintain: no Letta agent %s (run `mas letta provision`)", role)
        for name, agent in agents.items():
            found[name] = agent.id
            group = sleeptime_group(agent)
            for n, sleeptime_id in enumerate(group.agent_ids if group else ()):
                companions[f"{name}_sleeptime" + (f"_{n + 1}" if n else "")] = sleeptime_id
    return found, companions


def maintain(settings: Settings, *, api=None, lock: bool = True) -> list[Action]:
    """Maintenance v3 on every Letta agent; one Action per agent. Raises LettaUnavailable when the
    server is down (the seed's cron aborted then too; the beat runs it again next time).

    With `lock`, a primary agent is maintained under the same advisory lock its role calls take, so a
    compaction or reset never interleaves with a message being answered.
    """
    api = api or client(settings)
    state = health(settings, api=api)
    if not state.ok:
        log.error("maintain: Letta unavailable, nothing done: %s", state.detail)
        raise LettaUnavailable(f"Letta at {settings.letta.url} is unavailable: {state.detail}")
    actions = []
    primaries, companions = targets(api)
    for name, agent_id in (primaries | companions).items():
        try:
            with conversations.exclusive(settings, name) if lock and name in primaries else nullcontext():
                action = maintain_agent(settings, api, name, agent_id)
        except (LettaError, LockTimeout) as exc:  # one agent failing must not stop the others
            log.error("maintain %s: %s", name, exc)
            continue
        buffer_policy.log_action(log, action)
        actions.append(action)
    return actions


def maintain_agent(settings: Settings, api, name: str, agent_id: str) -> Action:
    """Apply the buffer policy to one agent and say what was done."""
    with translated(f"reading agent {agent_id}"):
        agent = api.agents.retrieve(agent_id)
    before, failures = len(agent.message_ids or []), _failures(agent.metadata)
    decision = buffer_policy.decide(settings, messages=before, failures=failures)
    done = _carry_out(settings, api, agent_id, decision, failures=failures)
    after = before if done.action == "ok" else in_context(api, agent_id)
    return buffer_policy.record(name, done, before=before, after=after)


def _carry_out(settings: Settings, api, agent_id: str, decision: Decision, *, failures: int) -> Decision:
    """Compact or reset as decided; the decision as finally carried out."""
    if decision.action == "reset":
        reset(api, agent_id)
    if decision.action != "summarize":
        return decision
    try:
        with translated(f"compacting {agent_id}"):
            result = api.with_options(timeout=COMPACT_TIMEOUT_S, max_retries=0).agents.messages.compact(agent_id)
    except LettaError as exc:
        follow_up = buffer_policy.after_failed_summary(
            settings, decision, failures=failures + 1, problem=f"compaction failed: {exc}"
        )
        if follow_up.action == "reset":
            reset(api, agent_id)
        else:
            set_failed_compactions(api, agent_id, failures + 1)
        return follow_up
    if failures:
        set_failed_compactions(api, agent_id, 0)
    return decision.noting(f"compacted {result.num_messages_before} -> {result.num_messages_after}")


def reset(api, agent_id: str) -> None:
    """Clear the agent's in-context messages (its system message stays) and its failure count."""
    with translated(f"resetting {agent_id}"):
        api.agents.messages.reset(agent_id, add_default_initial_messages=False)
    set_failed_compactions(api, agent_id, 0)


def failed_compactions(api, agent_id: str) -> int:
    """Compactions of this agent that failed in a row, as recorded on the server."""
    with translated(f"reading agent {agent_id}"):
        return _failures(api.agents.retrieve(agent_id).metadata)


def set_failed_compactions(api, agent_id: str, count: int) -> None:
    """Record `count` failed compactions in the agent's metadata (no write when it already says so)."""
    with translated(f"reading agent {agent_id}"):
        metadata = dict(api.agents.retrieve(agent_id).metadata or {})
    if _failures(metadata) == count:
        return
    metadata[FAILED_COMPACTIONS_KEY] = count
    with translated(f"recording failed compactions of {agent_id}"):
        api.agents.update(agent_id, metadata=metadata)


def _failures(metadata: dict | None) -> int:
    try:
        return int((metadata or {}).get(FAILED_COMPACTIONS_KEY, 0) or 0)
    except (TypeError, ValueError):
        return 0
