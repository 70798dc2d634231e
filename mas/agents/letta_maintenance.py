"""Message-buffer maintenance of the Letta agents: the seed's `letta_maintenance_v3.py` cron, as a function.

The same v3 policy as `mas.memory.recall.maintain` applies to the offline buffers, here on each Letta
agent's in-context messages (`len(agent.message_ids)`), primary agents and sleeptime companions alike:

- count >= MAS_BUFFER_CRITICAL (or EMERGENCY): reset the messages;
- count >= MAS_BUFFER_WARN: compact (Letta's summarize route), unless MAS_MAX_FAILED_SUMMARIES compactions
  already failed in a row, then reset; a failing compaction counts a failure and resets when the count
  reaches the maximum;
- below WARN: nothing.

Failed compactions are counted in the agent's own metadata on the server (`mas_failed_compactions`), so
the count survives worker restarts without a state file; a success or a reset sets it back to 0. Letta
refuses to compact a short history (HTTP 400); that counts as a failure like any other. Every decision is
returned as a `mas.memory.recall.Action` with counts before and after, and logged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from mas.agents.letta import (
    AGENT_LOCK_TIMEOUT_S,
    FAILED_COMPACTIONS_KEY,
    ROLES,
    LettaError,
    LettaUnavailable,
    _advisory_lock,
    _find_agent,
    _group,
    _translated,
    client,
)
from mas.config import Settings
from mas.memory.recall import Action, ActionKind, Level, level

log = logging.getLogger(__name__)

COMPACT_TIMEOUT_S = 300.0
"""Longest one compaction (an LLM summary of the evicted messages) may take."""

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
        with _translated("health check"):
            answer = api.health()
        with _translated("listing agents"):
            api.agents.list(limit=1)
    except LettaError as exc:
        return Health(ok=False, detail=str(exc))
    return Health(ok=answer.status == "ok", version=answer.version, detail=answer.status)


def in_context(api, agent_id: str) -> int:
    """Messages in the agent's context window now (its system message included)."""
    with _translated(f"reading agent {agent_id}"):
        return len(api.agents.retrieve(agent_id).message_ids or [])


def targets(settings: Settings, *, api=None) -> dict[str, str]:
    """Every agent to maintain, by the names recall uses: director, ..., director_sleeptime, ... -> id."""
    api = api or client(settings)
    found: dict[str, str] = {}
    companions: dict[str, str] = {}
    for role in ROLES:
        agent = _find_agent(api, role)
        if agent is None:
            log.warning("maintain: no Letta agent %s (run `mas letta provision`)", role)
            continue
        found[role] = agent.id
        group = _group(agent)
        for n, sleeptime_id in enumerate(group.agent_ids if group else ()):
            companions[f"{role}_sleeptime" + (f"_{n + 1}" if n else "")] = sleeptime_id
    return found | companions


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
        raise LettaUnavailable(f"Letta at {settings.letta_url} is unavailable: {state.detail}")
    actions = []
    for name, agent_id in targets(settings, api=api).items():
        try:
            if lock and name in ROLES:
                with _advisory_lock(settings, f"agent:{name}", timeout_s=AGENT_LOCK_TIMEOUT_S):
                    action = maintain_agent(settings, api, name, agent_id)
            else:
                action = maintain_agent(settings, api, name, agent_id)
        except LettaError as exc:  # one agent failing must not stop the others
            log.error("maintain %s: %s", name, exc)
            continue
        log.log(
            {"ok": logging.DEBUG, "summarize": logging.INFO, "reset": logging.WARNING}[action.action],
            "maintain %s: %s at level %s, %d -> %d messages: %s",
            name, action.action, action.level, action.count_before, action.count_after, action.reason,
        )
        actions.append(action)
    return actions


def maintain_agent(settings: Settings, api, name: str, agent_id: str) -> Action:
    """Apply the v3 policy to one agent and say what was done."""
    before = in_context(api, agent_id)
    lvl = level(settings, before)
    kind, reason = _apply(settings, api, agent_id, lvl, before)
    after = before if kind == "ok" else in_context(api, agent_id)
    return Action(agent=name, count_before=before, action=kind, level=lvl, count_after=after, reason=reason)


def _apply(settings: Settings, api, agent_id: str, lvl: Level, before: int) -> tuple[ActionKind, str]:
    limit = settings.max_failed_summaries
    if lvl == "ok":
        return "ok", f"{before} messages < warn threshold {settings.buffer_warn}"
    if lvl != "warn":
        threshold = settings.buffer_emergency if lvl == "emergency" else settings.buffer_critical
        reset(api, agent_id)
        return "reset", f"{before} messages >= {lvl} threshold {threshold}"
    failed = failed_compactions(api, agent_id)
    if failed >= limit:
        reset(api, agent_id)
        return "reset", f"{failed} failed compactions >= {limit}"
    try:
        with _translated(f"compacting {agent_id}"):
            result = api.with_options(timeout=COMPACT_TIMEOUT_S, max_retries=0).agents.messages.compact(agent_id)
    except LettaError as exc:
        failed += 1
        if failed < limit:
            _set_failed_compactions(api, agent_id, failed)
            return "summarize", f"compaction failed: {exc}; {failed} of {limit} failures"
        reset(api, agent_id)
        return "reset", f"compaction failed: {exc}; {failed} failures reached {limit}"
    if failed:
        _set_failed_compactions(api, agent_id, 0)
    return "summarize", (
        f"{before} messages >= warn threshold {settings.buffer_warn}; compacted "
        f"{result.num_messages_before} -> {result.num_messages_after}"
    )


def reset(api, agent_id: str) -> None:
    """Clear the agent's in-context messages (its system message stays) and its failure count."""
    with _translated(f"resetting {agent_id}"):
        api.agents.messages.reset(agent_id, add_default_initial_messages=False)
    _set_failed_compactions(api, agent_id, 0)


def failed_compactions(api, agent_id: str) -> int:
    with _translated(f"reading agent {agent_id}"):
        metadata = api.agents.retrieve(agent_id).metadata or {}
    try:
        return int(metadata.get(FAILED_COMPACTIONS_KEY, 0))
    except (TypeError, ValueError):
        return 0


def _set_failed_compactions(api, agent_id: str, count: int) -> None:
    with _translated(f"reading agent {agent_id}"):
        metadata = dict(api.agents.retrieve(agent_id).metadata or {})
    if int(metadata.get(FAILED_COMPACTIONS_KEY, 0) or 0) == count:
        return
    metadata[FAILED_COMPACTIONS_KEY] = count
    with _translated(f"recording failed compactions of {agent_id}"):
        api.agents.update(agent_id, metadata=metadata)

