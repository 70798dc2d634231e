"""`Settings`: the groups together, by the attribute that holds each, and what spans groups."""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from mas import urls
from mas.config.agents import ABSettings, AgentSettings, LettaSettings, LLMSettings, MemorySettings
from mas.config.base import CONFIG, Group
from mas.config.rendering import ComfyUISettings, DiffusersSettings, GpuSettings, QualitySettings, VideoSettings
from mas.config.scheduling import QuotaSettings, ReliabilitySettings, SchedulingSettings
from mas.config.servers import BrokerSettings, DatabaseSettings, StorageSettings
from mas.config.serving import ServiceSettings, WebhookSettings
from mas.redaction import redact_url

GROUPS: dict[str, type[Group]] = {
    "database": DatabaseSettings,
    "broker": BrokerSettings,
    "storage": StorageSettings,
    "video": VideoSettings,
    "comfyui": ComfyUISettings,
    "diffusers": DiffusersSettings,
    "gpu": GpuSettings,
    "quality": QualitySettings,
    "agents": AgentSettings,
    "ab": ABSettings,
    "letta": LettaSettings,
    "llm": LLMSettings,
    "service": ServiceSettings,
    "webhooks": WebhookSettings,
    "scheduling": SchedulingSettings,
    "reliability": ReliabilitySettings,
    "memory": MemorySettings,
    "quotas": QuotaSettings,
}
"""The groups of `Settings`, by the attribute that holds each."""

VARIABLES: dict[str, tuple[str, str]] = {
    str(field.validation_alias).removeprefix("MAS_").lower(): (group, name)
    for group, model in GROUPS.items()
    for name, field in model.model_fields.items()
}
"""Each group's setting by its variable's name without MAS_ (`write_ahead`: the scheduling group's
`write_ahead`; `llm_url`: the llm group's `url`)."""


def _grouped(values: dict[str, Any]) -> dict[str, Any]:
    """Values named by their variables, sorted into their groups; the top-level one (data_dir) as it is.
    A name that is no setting is refused, never ignored."""
    grouped: dict[str, Any] = {}
    for key, value in values.items():
        if key == "data_dir" or (key in GROUPS and isinstance(value, Group)):
            grouped[key] = value
        elif key.lower().removeprefix("mas_") in VARIABLES:
            group, name = VARIABLES[key.lower().removeprefix("mas_")]
            env = GROUPS[group].model_fields[name].validation_alias
            grouped.setdefault(group, {})[env] = value  # by its variable: an error names MAS_...
        else:
            raise TypeError(f"no setting is named {key!r} (a variable's name without MAS_, such as write_ahead)")
    return grouped


class Settings(BaseSettings):
    """Configuration of a `mas` installation: where it keeps its data and one group per
    concern (`settings.llm.url` is MAS_LLM_URL; each field's description says what it does)."""

    model_config = SettingsConfigDict(**{**CONFIG, "env_prefix": "MAS_"})

    data_dir: Path = Field(
        validation_alias="MAS_DATA_DIR",
        default=Path.home() / ".mas",
        description="Folder for the embedded services' data, videos and adapters.",
    )
    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    broker: BrokerSettings = Field(default_factory=BrokerSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    video: VideoSettings = Field(default_factory=VideoSettings)
    comfyui: ComfyUISettings = Field(default_factory=ComfyUISettings)
    diffusers: DiffusersSettings = Field(default_factory=DiffusersSettings)
    gpu: GpuSettings = Field(default_factory=GpuSettings)
    quality: QualitySettings = Field(default_factory=QualitySettings)
    agents: AgentSettings = Field(default_factory=AgentSettings)
    ab: ABSettings = Field(default_factory=ABSettings)
    letta: LettaSettings = Field(default_factory=LettaSettings)
    llm: LLMSettings = Field(default_factory=LLMSettings)
    service: ServiceSettings = Field(default_factory=ServiceSettings)
    webhooks: WebhookSettings = Field(default_factory=WebhookSettings)
    scheduling: SchedulingSettings = Field(default_factory=SchedulingSettings)
    reliability: ReliabilitySettings = Field(default_factory=ReliabilitySettings)
    memory: MemorySettings = Field(default_factory=MemorySettings)
    quotas: QuotaSettings = Field(default_factory=QuotaSettings)

    def __init__(self, **values: Any) -> None:
        """Values by their variable's name, as in the environment without MAS_: `Settings(write_ahead=2)` is
        MAS_WRITE_AHEAD=2; every other value comes from the environment."""
        super().__init__(**_grouped(values))

    @model_validator(mode="before")
    @classmethod
    def _read_groups(cls, data: Any) -> Any:
        """A group given some values takes the rest from the environment, as a group not given at all does."""
        if isinstance(data, dict):
            data = {
                key: GROUPS[key](**value) if key in GROUPS and isinstance(value, dict) else value
                for key, value in data.items()
            }
        return data

    @field_validator("data_dir")
    @classmethod
    def _check_data_dir(cls, value: Path) -> Path:
        if str(value).strip() in ("", "."):
            raise ValueError("MAS_DATA_DIR is empty; name a folder (default ~/.mas), not the current directory")
        if value.exists() and not value.is_dir():
            raise ValueError(f"MAS_DATA_DIR {value} exists and is not a folder")
        return value

    @model_validator(mode="after")
    def _check_across_groups(self) -> Settings:
        held = self.gpu_task_held_seconds
        if self.broker.visibility_timeout_seconds is not None and self.broker.visibility_timeout_seconds <= held:
            raise ValueError(
                f"MAS_VISIBILITY_TIMEOUT_SECONDS must exceed (1 + MAS_GPU_LOOKAHEAD) * MAS_MAX_RENDER_SECONDS "
                f"({held} s: a gpu task may wait behind the lookahead before it runs), or Redis re-delivers "
                f"renders while they still run"
            )
        return self

    def changed(self, **changes: Any) -> Settings:
        """These settings with some values changed, by their variable's name (`changed(write_ahead=2)`), all
        validated again. A name that is no setting is refused."""
        grouped = _grouped(changes)
        values: dict[str, Any] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, Group) and name in grouped:
                value = type(value).model_validate({**value.by_variable(), **grouped[name]})
            elif name in grouped:
                value = grouped[name]
            values[name] = value
        return type(self).model_validate(values)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Settings:
        """A copy; changed values go through `changed` (by variable name, validated), never set unchecked."""
        return self.changed(**dict(update)) if update else super().model_copy(deep=deep)

    # --- derived ---------------------------------------------------------------------------------
    @property
    def gpu_task_held_seconds(self) -> int:
        """The longest a gpu worker may hold a task unacknowledged: behind its lookahead, then its own render."""
        return (1 + self.gpu.lookahead) * self.gpu.max_render_seconds

    @property
    def visibility_timeout_seconds(self) -> int:
        """After how long Redis hands an unacknowledged task back: MAS_VISIBILITY_TIMEOUT_SECONDS, else the
        longest a gpu task may be held with half again for margin."""
        return self.broker.visibility_timeout_seconds or self.gpu_task_held_seconds * 3 // 2

    @property
    def groups_gpu_work(self) -> bool:
        """Whether gradings wait in their own queue for the gpu worker to finish a run of renders."""
        return self.video.backend == "diffusers" if self.gpu.grouping == "auto" else self.gpu.grouping

    @property
    def embedded_database(self) -> bool:
        return self.database.url is None

    @property
    def embedded_broker(self) -> bool:
        return self.broker.url is None

    @property
    def pgdata(self) -> Path:
        return self.data_dir.resolve() / "postgres"

    @cached_property
    def redis_socket(self) -> Path:
        """Unix socket of the embedded Redis; kept short because sockets allow ~100 characters."""
        path = self.data_dir.resolve() / "redis" / "redis.sock"
        if len(str(path)) < 100:
            return path
        digest = hashlib.sha1(str(self.data_dir.resolve()).encode()).hexdigest()[:10]
        return Path(tempfile.gettempdir()) / f"mas-{digest}" / "redis.sock"

    @property
    def videos_dir(self) -> Path:
        return (self.storage.output_dir or self.data_dir / "videos").resolve()

    @property
    def effective_broker_url(self) -> str:
        return self.broker.url or f"redis+socket://{self.redis_socket}"

    @property
    def effective_result_backend(self) -> str:
        return self.broker.result_backend or self.effective_broker_url

    def values(self) -> dict[str, Any]:
        """Every setting by its MAS_ variable."""
        found: dict[str, Any] = {"MAS_DATA_DIR": self.data_dir}
        for name in GROUPS:
            group = getattr(self, name)
            found |= group.by_variable()
        return found

    def secret_values(self) -> list[str]:
        """Every secret these settings hold (API keys, tokens, passwords, the passwords inside URLs), for
        `mas.redaction.redact_text` to hide wherever they might appear."""
        found = []
        for value in self.values().values():
            if isinstance(value, SecretStr):
                found.append(value.get_secret_value())
            elif isinstance(value, str) and "://" in value and "@" in value:
                found.extend(urls.passwords(value))
        return [secret for secret in found if secret]

    def describe(self) -> dict[str, str]:
        """What a user may see: every setting by its variable's name without MAS_ (llm_url), passwords hidden."""
        shown: dict[str, str] = {}
        for env, value in self.values().items():
            name = env.removeprefix("MAS_").lower()
            if isinstance(value, SecretStr):
                value = "***" if value.get_secret_value() else ""
            elif name.endswith("_url") or name == "result_backend":
                value = redact_url(value)
            elif isinstance(value, tuple) and all(isinstance(item, str) for item in value):
                value = ",".join(value)  # as the environment gives it
            shown[name] = "" if value is None else str(value)
        return shown
