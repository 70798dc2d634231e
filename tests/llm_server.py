"""A REAL LLM server for the tests: llama.cpp's OpenAI-compatible server with SmolLM2-135M-Instruct.

Built once per machine by `scripts/llm-server-env.sh` (cached outside the checkout, keyed by version).
Tests that need it skip with the reason when it is not built, or fail when MAS_TEST_REQUIRE_LLM=1 (CI).
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx

from tests.harness.processes import Server
from tests.ports import free_port

VERSION = "0.3.36"
VENV = Path(
    os.environ.get("LLM_VENV")
    or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mas" / f"llm-server-venv-{VERSION}"
)
MODEL_NAME = "smollm2-135m-instruct"
CONTEXT_TOKENS = 8192


def unavailable_reason() -> str | None:
    """Why the real server cannot run here (None when it can)."""
    if not (VENV / "mas-llm-ready").exists():
        return f"the LLM server is not built ({VENV}); run: bash scripts/llm-server-env.sh"
    return None


GEMMA_MODEL = (
    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mas" / "models" / "gemma-3-270m-q4_k_m.gguf"
)
"""Gemma 3 270M (a pretrained base model, Q4_K_M), assembled by `scripts/gemma-model.sh` (benchmarks only)."""


THREADS = 1 if os.environ.get("PYTEST_XDIST_WORKER") else os.cpu_count() or 2
"""llama.cpp's threads: every core, unless the tests run in parallel (pytest -n): then one, since a thread that
waits for a second one the other tests have preempted stalls every token."""


class LocalLLM(Server):
    """llama.cpp's server on a local port, stopped with `stop()` (or the context manager); `model` is a GGUF
    file other than the tests' SmolLM2, served under `alias`."""

    stop_timeout = 10

    def __init__(self, log_dir: Path, *, port: int | None = None, model: Path | None = None,
                 alias: str = MODEL_NAME) -> None:  # fmt: skip
        super().__init__(log_dir, address="127.0.0.1")
        self.model, self.alias = model, alias
        self.port = port or free_port()
        self.log = log_dir / f"llm-server-{self.port}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def answering(self) -> bool:
        try:
            return httpx.get(f"{self.url}/models", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def start(self, timeout: float = 120) -> LocalLLM:
        model = str(self.model or (VENV / "mas-llm-model").read_text().strip())
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.launch(
            [str(VENV / "bin" / "python"), "-m", "llama_cpp.server", "--model", model, "--model_alias", self.alias,
             "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", str(CONTEXT_TOKENS),
             "--n_threads", str(THREADS), "--flash_attn", "true"],  # faster on prompts (scripts/llm-server-env.sh)
            what="the LLM server", timeout=timeout, interval=0.3,
        )  # fmt: skip
        return self

    def __enter__(self) -> LocalLLM:
        return self.start()
