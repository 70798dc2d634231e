"""The embedding model as the studio runs it (ONNX Runtime, exported once per machine) against
sentence-transformers itself, on the same local all-MiniLM-L6-v2."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from mas.memory.embedding_export import EmbeddingUnavailable, _key, exported_model
from mas.memory.embeddings import OnnxEncoder, default_model_path, open_embedder
from tests.conftest import ROOT

TEXTS = [
    "a moody dark forest at dawn, slow dolly in",
    "Évitez tout rouge, s'il vous plaît : des tons froids, bleus et gris.",
    "avoid any red",
    "no",
    "",
    "rain over a neon city " * 80,  # past the model's 256 tokens: cut where sentence-transformers cuts it
]


def test_the_studios_vectors_are_sentence_transformers_vectors(tmp_path):
    from sentence_transformers import SentenceTransformer

    model_dir = default_model_path()
    expected = SentenceTransformer(str(model_dir), device="cpu", local_files_only=True).encode(
        TEXTS, normalize_embeddings=True
    )
    embedder = open_embedder(model_dir, tmp_path)
    got = np.asarray(embedder.embed(TEXTS))
    assert got.shape == expected.shape == (len(TEXTS), 384)
    assert np.abs(got - expected).max() < 1e-4
    assert [p.suffix for p in tmp_path.iterdir() if p.suffix != ".lock"] == [".onnx"]  # nothing half-written


def test_processes_starting_at_once_share_one_export(tmp_path):
    """Two processes find no export at once: one exports, the other waits for it; each then embeds alike."""
    code = (
        "import sys; from pathlib import Path; from mas.memory.embeddings import OnnxEncoder, default_model_path, open_embedder;"
        "print(open_embedder(default_model_path(), Path(sys.argv[1])).embed_one('a quiet harbour')[:3])"
    )
    started = [
        subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in started]
    assert [p.returncode for p in started] == [0, 0]
    assert outputs[0] == outputs[1]
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".lock", ".onnx"]


def test_a_folder_that_is_no_model_is_refused_and_leaves_nothing(tmp_path):
    (tmp_path / "model").mkdir()
    with pytest.raises(EmbeddingUnavailable, match="no sentence-transformers model"):
        exported_model(tmp_path / "model", tmp_path / "cache")
    (tmp_path / "model" / "modules.json").write_text("[]")  # a model folder in name only
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / f"model-{_key(tmp_path / 'model')}.999999.part").write_bytes(b"an exporter killed mid-way")
    with pytest.raises(EmbeddingUnavailable, match="could not be exported"):
        exported_model(tmp_path / "model", tmp_path / "cache")
    assert [p.suffix for p in (tmp_path / "cache").iterdir()] == [".lock"]


def test_an_export_onnx_runtime_cannot_read_is_a_clear_error(tmp_path):
    broken = tmp_path / "model.onnx"
    broken.write_bytes(b"not a graph")
    with pytest.raises(EmbeddingUnavailable, match="delete it to export again") as refused:
        OnnxEncoder(broken, default_model_path())
    assert not refused.value.retryable
