"""One typed settings object for the whole studio, grouped by concern.

Every value comes from its `MAS_` environment variable (each field names it: its alias), a `.env` file in the
working directory, or the default written here. Each group validates itself; `Settings` checks what spans
groups. With no service URLs set, `mas` runs its own PostgreSQL and Redis under the data directory (see
`mas.runtime.services`). Change values with `Settings.changed`, which validates them again.
"""

from mas.config.agents import ABSettings, AgentSettings, LettaSettings, LLMSettings, MemorySettings
from mas.config.base import USER_PATTERN, Group, is_loopback
from mas.config.rendering import ComfyUISettings, DiffusersSettings, GpuSettings, QualitySettings, VideoSettings
from mas.config.scheduling import QuotaSettings, ReliabilitySettings, SchedulingSettings
from mas.config.servers import BrokerSettings, DatabaseSettings, StorageSettings
from mas.config.serving import ServiceSettings, WebhookSettings, check_webhook_secret
from mas.config.settings import GROUPS, VARIABLES, Settings
from mas.redaction import redact_url

__all__ = [
    "GROUPS",
    "USER_PATTERN",
    "VARIABLES",
    "ABSettings",
    "AgentSettings",
    "BrokerSettings",
    "ComfyUISettings",
    "DatabaseSettings",
    "DiffusersSettings",
    "GpuSettings",
    "Group",
    "LLMSettings",
    "LettaSettings",
    "MemorySettings",
    "QualitySettings",
    "QuotaSettings",
    "ReliabilitySettings",
    "SchedulingSettings",
    "ServiceSettings",
    "Settings",
    "StorageSettings",
    "VideoSettings",
    "WebhookSettings",
    "check_webhook_secret",
    "is_loopback",
    "redact_url",
]
