"""The embedding model as an ONNX graph, exported once per machine from the local sentence-transformers folder.

A process that embeds runs MiniLM with ONNX Runtime: it starts in under a second, where importing
sentence-transformers, transformers and torch took 8-12 s of a core in every cpu worker and every command that
embeds, for the same vectors (the export is checked against sentence-transformers by the tests). The graph holds
the model, its pooling and the normalization; the tokenizer runs beside it (`tokenizer.json`, the `tokenizers`
package). The export imports torch and sentence-transformers once, and its file is cached under a key made of
the model folder's files, so a changed model is exported again.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any

from mas.errors import PermanentError

log = logging.getLogger(__name__)

FORMAT = 1
"""Raise when the exported graph changes (its inputs, outputs or what it computes): old files are then unused."""

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")


class EmbeddingUnavailable(PermanentError):
    """The embedding model cannot be loaded; the message says what to install or configure."""


def default_cache_dir() -> Path:
    """Where exported models live when the settings name no folder: the user's cache, shared by every studio."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mas" / "embeddings"


def exported_model(model_dir: Path, cache_dir: Path) -> Path:
    """The ONNX file for `model_dir`, exporting it first if this machine has none yet.

    Processes starting at once export it once: the others wait on a file lock, which the system releases even
    if the exporting process dies, and find the file written whole (written aside, then renamed). The lock and
    the file are this host's: each host exports its own."""
    target = cache_dir / f"{model_dir.name}-{_key(model_dir)}.onnx"
    if target.is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with (cache_dir / f"{target.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.is_file():
            for stale in cache_dir.glob(f"{target.stem}.*.part"):  # left by an exporter that was killed
                stale.unlink(missing_ok=True)
            aside = target.with_suffix(f".{os.getpid()}.part")
            try:
                _export(model_dir, aside)
                os.replace(aside, target)
            finally:
                aside.unlink(missing_ok=True)
    return target


def _key(model_dir: Path) -> str:
    """Names, sizes and modification times of the folder's files, and the export's format."""
    if not (model_dir / "modules.json").is_file():
        raise EmbeddingUnavailable(f"{model_dir} holds no sentence-transformers model (no modules.json)")
    files = sorted(p for p in model_dir.rglob("*") if p.is_file())
    listing = [(str(p.relative_to(model_dir)), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    return hashlib.sha256(json.dumps([FORMAT, listing]).encode()).hexdigest()[:16]


def _export(model_dir: Path, target: Path) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import torch
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise EmbeddingUnavailable(
            f"exporting the embedding model needs torch, sentence-transformers and onnx: {exc}"
        ) from exc

    class Sentences(torch.nn.Module):
        """Token ids in, unit-length sentence vectors out: the model's own modules, its pooling included."""

        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            features = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
            return torch.nn.functional.normalize(self.model(features)["sentence_embedding"], p=2, dim=1)

    example = torch.ones((2, 8), dtype=torch.long)
    axes = {name: {0: "texts", 1: "tokens"} for name in INPUT_NAMES} | {"embedding": {0: "texts"}}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracer's notes on the shapes it fixes; MiniLM's graph holds for all
            model = SentenceTransformer(str(model_dir), device="cpu", local_files_only=True).eval()
            torch.onnx.export(
                Sentences(model),
                (example, example, torch.zeros_like(example)),
                str(target),
                input_names=list(INPUT_NAMES),
                output_names=["embedding"],
                dynamic_axes=axes,
                opset_version=17,
                dynamo=False,  # the TorchScript exporter: no onnxscript, and MiniLM traces whole
            )
    except Exception as exc:  # loading and exporting raise many kinds; each means the same here
        raise EmbeddingUnavailable(f"the embedding model in {model_dir} could not be exported to ONNX: {exc}") from exc
    log.info("exported the embedding model in %s to %s", model_dir, target.parent)
