"""The Letta agent backend: Director, Writer and Cameraman as stateful agents on a Letta server.

Chosen with MAS_AGENT_BACKEND=letta; MAS_LETTA_URL and MAS_LETTA_TOKEN say where the server is (the
token is sent as a bearer token and never printed). One job per module:

- `errors`: LettaError and its leaves, each retryable or permanent (`mas.errors`);
- `client`: the letta-client connection, one per process, and the translation of its exceptions;
- `server`: finding the studio's blocks and agents on the server (by name and tag, never a stored id);
- `provisioning`: creating and repairing the six shared blocks and three sleeptime-enabled agents;
- `prompts`, `replies`: what a role call says, and reading the JSON object of the answer;
- `roles`: the four roles of `mas.agents.roles` played by the agents;
- `blocks`: the core blocks on the server, brought up to date with the studio's before each role call;
- `maintenance`: the buffer policy (`mas.memory.buffer_policy`) applied to the agents' messages;
- `status`: health and what `mas letta status` shows.
"""

from mas.agents.letta.blocks import LettaBlockStore, push_studio_blocks
from mas.agents.letta.client import client
from mas.agents.letta.errors import (
    LettaError,
    LettaMisconfigured,
    LettaNotFound,
    LettaRejected,
    LettaReplyError,
    LettaUnavailable,
)
from mas.agents.letta.maintenance import maintain
from mas.agents.letta.provisioning import AgentIds, Provisioned, find, forget, provision
from mas.agents.letta.roles import letta_agents
from mas.agents.letta.server import ROLES, TAG, crew_conversations, set_sleeptime_frequency, sleeptime_frequency
from mas.agents.letta.status import Health, LettaStatus, health, status

__all__ = [
    "ROLES",
    "TAG",
    "AgentIds",
    "Health",
    "LettaBlockStore",
    "LettaError",
    "LettaMisconfigured",
    "LettaNotFound",
    "LettaRejected",
    "LettaReplyError",
    "LettaStatus",
    "LettaUnavailable",
    "Provisioned",
    "client",
    "crew_conversations",
    "find",
    "forget",
    "health",
    "letta_agents",
    "maintain",
    "provision",
    "push_studio_blocks",
    "set_sleeptime_frequency",
    "sleeptime_frequency",
    "status",
]
