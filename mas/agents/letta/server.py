"""Finding what the studio owns on a Letta server: by name and the tag `mas`, never by a stored id.

Shared by provisioning (which creates what is missing), status (which only looks) and maintenance (which
walks every agent), so all three see the server the same way.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from mas.agents.letta.client import translated
from mas.agents.letta.errors import LettaRejected, LettaUnavailable
from mas.memory.blocks import SCHEMAS

log = logging.getLogger(__name__)

TAG = "mas"
"""Tag on every agent and block this backend owns; with the name it is how they are found again."""

ROLES = ("director", "writer", "cameraman")
"""The Letta agents, by name. Each gets a sleeptime companion named `<name>-sleeptime`."""


def blocks_by_label(api, labels=tuple(SCHEMAS)) -> dict[str, list]:
    """The studio's blocks on the server for each label, oldest id first (empty: missing)."""
    found: dict[str, list] = {}
    for label in labels:
        with translated(f"listing block {label}"):
            matches = [b for b in api.blocks.list(label=label, tags=[TAG]) if b.label == label]
        found[label] = sorted(matches, key=lambda b: b.id)
    return found


def find_agent(api, role: str):
    """The agent named `role` tagged `mas` (the oldest, if a race ever made two), with its relations."""
    with translated(f"looking up agent {role}"):
        matches = [
            a for a in api.agents.list(
                name=role, tags=[TAG], include=["agent.tags", "agent.managed_group", "agent.blocks"]
            )
            if a.name == role
        ]
    if len(matches) > 1:
        log.warning("%d Letta agents named %r carry tag %r; using the oldest", len(matches), role, TAG)
    return min(matches, key=lambda a: (str(a.created_at or ""), a.id)) if matches else None


def sleeptime_group(agent) -> Any | None:
    """The agent's sleeptime group (None: sleeptime is off); Letta has used two attribute names."""
    return agent.managed_group or agent.multi_agent_group


def sleeptime_frequency(api, group_id: str) -> int | None:
    """How many turns pass between runs of the group's sleeptime companion (None: unreadable)."""
    import httpx

    with translated(f"reading group {group_id}"):
        response = api.get(f"/v1/groups/{group_id}", cast_to=httpx.Response)
    return response.json().get("sleeptime_agent_frequency") if response.status_code < 400 else None


def set_sleeptime_frequency(api, group_id: str, frequency: int) -> None:
    """Run the sleeptime companion every `frequency` turns (letta-client has no groups resource)."""
    import httpx

    what = f"setting the sleeptime frequency of group {group_id}"
    body = {"manager_config": {"manager_type": "sleeptime", "sleeptime_agent_frequency": int(frequency)}}
    with translated(what):
        response = api.patch(f"/v1/groups/{group_id}", body=body, cast_to=httpx.Response)
    if response.status_code >= 500:
        raise LettaUnavailable(f"{what}: HTTP {response.status_code}")
    if response.status_code >= 400:
        raise LettaRejected(f"{what}: HTTP {response.status_code}")


def in_context(api, agent_id: str) -> int:
    """Messages in the agent's context window now (its system message included)."""
    with translated(f"reading agent {agent_id}"):
        return len(api.agents.retrieve(agent_id).message_ids or [])


def block_text(value: dict[str, Any]) -> str:
    """A core block's value as the server keeps it: the JSON whose length `mas.memory.blocks` caps."""
    return json.dumps(value)
