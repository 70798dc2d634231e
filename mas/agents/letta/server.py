"""Finding what the studio owns on a Letta server: by name and the tag `mas`, never by a stored id.

Shared by provisioning (which creates what is missing), status (which only looks) and maintenance (which
walks every agent), so all three see the server the same way.

Each user has a crew of their own: the agents `director`, ... of the default user, and for a named user
agents tagged `mas:user:<name>` (named `director-<name>` for people, a `.` shown as `_`: Letta allows no
`.` or `@` in a name), so each user's agents remember that user's productions. The studio calls them
`director@<name>`, as it names their block rows (`mas.memory.blocks.row_label`). The blocks that hold a
user's taste (`PER_USER`) are that user's: a named user's carry the tag `mas:user:<name>`, the default
user's no user tag (as before users existed). The other blocks are the studio's, one of each, attached to
every crew.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from mas.agents.letta.client import translated
from mas.agents.letta.errors import LettaRejected, LettaUnavailable
from mas.config import Settings
from mas.memory import recall
from mas.memory.blocks import PER_USER, SCHEMAS
from mas.models import DEFAULT_USER, users_own

log = logging.getLogger(__name__)

TAG = "mas"
"""Tag on every agent and block this backend owns; with the name it is how they are found again."""

ROLES = ("director", "writer", "cameraman")
"""The roles the Letta agents play: MAS_AGENT_CONVERSATIONS agents each (`crew_conversations`). Each agent
gets a sleeptime companion named `<name>-sleeptime`."""


def crew_conversations(settings: Settings) -> list[str]:
    """The agents of a crew, by conversation name: director, director.1, ..., writer, writer.1, ..."""
    return [name for role in ROLES for name in recall.conversations(role, settings.agents.conversations)]


USER_TAG_PREFIX = f"{TAG}:user:"
"""A named user's own blocks carry `mas:user:<name>`."""


def agent_name(role: str, user: str = DEFAULT_USER) -> str:
    """What the studio calls `user`'s agent for `role` (its lock, maintenance's log): the role itself for
    the default user, `role@user` otherwise."""
    return users_own(role, user)


def letta_name(role: str, user: str = DEFAULT_USER) -> str:
    """The agent's name on the server, for people (the user tag, not the name, says whose it is). Letta
    allows no '.' in a name: conversation `writer.1` is the agent `writer_1`."""
    name = role.replace(".", "_")
    return name if user == DEFAULT_USER else f"{name}-{user.replace('.', '_')}"


def user_tags(user: str) -> list[str]:
    """The owner's tag on a named user's agents and taste blocks (none for the default user)."""
    return [] if user == DEFAULT_USER else [f"{USER_TAG_PREFIX}{user}"]


def block_tags(label: str, user: str = DEFAULT_USER) -> list[str]:
    """The tags a block for `label` carries: `mas`, and the owner's tag on a named user's taste block."""
    return [TAG, *user_tags(user)] if label in PER_USER else [TAG]


def agent_tags(role: str, user: str = DEFAULT_USER) -> list[str]:
    """The tags an agent carries: `mas`, `mas:<role>`, and its owner's tag."""
    return [TAG, f"{TAG}:{role}", *user_tags(user)]


def _owner(thing) -> str:
    """The user a block or agent on the server belongs to (the default user: no user tag)."""
    return next((t[len(USER_TAG_PREFIX) :] for t in (thing.tags or []) if t.startswith(USER_TAG_PREFIX)), DEFAULT_USER)


def blocks_by_label(api, *, user: str = DEFAULT_USER, labels=tuple(SCHEMAS)) -> dict[str, list]:
    """The blocks `user`'s agents carry, for each label, oldest id first (empty: missing): the user's own
    taste blocks and the studio's shared ones."""
    found: dict[str, list] = {}
    for label in labels:
        owner = user if label in PER_USER else DEFAULT_USER
        with translated(f"listing block {label}"):
            matches = [b for b in api.blocks.list(label=label, tags=[TAG]) if b.label == label and _owner(b) == owner]
        found[label] = sorted(matches, key=lambda b: b.id)
    return found


def find_agent(api, role: str, *, user: str = DEFAULT_USER):
    """`user`'s agent for `role` (the oldest, if a race ever made two), with its relations."""
    name = letta_name(role, user)
    with translated(f"looking up agent {agent_name(role, user)}"):
        matches = [
            a
            for a in api.agents.list(
                name=name,
                tags=[TAG, *user_tags(user)],
                match_all_tags=True,
                include=["agent.tags", "agent.managed_group", "agent.blocks"],
            )
            if a.name == name and _owner(a) == user
        ]
    if len(matches) > 1:
        log.warning("%d Letta agents named %r carry tag %r; using the oldest", len(matches), name, TAG)
    return min(matches, key=lambda a: (str(a.created_at or ""), a.id)) if matches else None


def role_agents(api, role: str) -> dict[str, Any]:
    """Every user's agents for `role`, one per conversation (tagged `mas:<role>`; not their sleeptime
    companions, whatever tags Letta gives those), with their sleeptime groups, by what the studio calls them
    (`agent_name`: writer, writer.1@alice, ...)."""
    with translated(f"listing agents {role}"):
        found = list(
            api.agents.list(
                tags=[TAG, f"{TAG}:{role}"], match_all_tags=True, include=["agent.tags", "agent.managed_group"]
            )
        )
    companions = {i for a in found if (group := sleeptime_group(a)) for i in group.agent_ids}
    agents: dict[str, Any] = {}
    for agent in sorted(found, key=lambda a: (str(a.created_at or ""), a.id)):  # the oldest, as find_agent
        owner = _owner(agent)
        talks = {letta_name(talk, owner): talk for talk in recall.conversations(role, recall.MAX_CONVERSATIONS)}
        if agent.id not in companions and agent.name in talks:
            agents.setdefault(agent_name(talks[agent.name], owner), agent)
    return agents


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
