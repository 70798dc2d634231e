"""DQA grading, run for real on a tiny CLIP built and briefly trained here.

No weights come from a hub: the CLIP model is built from a tiny config, its tokenizer trained on the fly,
and a few dozen steps of contrastive training teach it three synthetic colour/shape concepts, so "does the
video show its prompt" has a right answer the grader must find. Videos are real H.264 mp4 files.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import imageio_ffmpeg
import numpy as np
import pytest
import sqlalchemy as sa
import torch
import torch.nn.functional as F

from gpu.dqa import DQAGrader, regrade
from gpu.dqa_phases import CHECKLISTS
from gpu.residency import Residency
from mas import grades
from mas.config import Settings
from mas.db import session_scope
from mas.domain.identity import STUDIO
from mas.gpu_rules import grading
from mas.gpu_rules.grading import BENCHMARK_METRICS, MULTI_AXES, GradingError
from mas.models import Attempt
from mas.video import VideoUnreadable, decode_video
from tests.rows import one_video

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

CONCEPTS = {"red circle": (220, 40, 40), "blue square": (40, 70, 220), "green triangle": (40, 190, 70)}
SIZE, CLIP_SIZE = 64, 32


def shape_image(name: str, *, rng: np.random.Generator, size: int = SIZE, centre=None, radius=None) -> np.ndarray:
    """A uint8 RGB picture of one concept: its shape in its colour on a dark, slightly noisy background."""
    colour = np.array(CONCEPTS[name], dtype=np.float32)
    cy, cx = centre if centre is not None else rng.uniform(0.3, 0.7, 2) * size
    r = radius if radius is not None else rng.uniform(0.18, 0.32) * size
    y, x = np.mgrid[0:size, 0:size].astype(np.float32)
    if name.endswith("circle"):
        mask = (y - cy) ** 2 + (x - cx) ** 2 <= r**2
    elif name.endswith("square"):
        mask = (np.abs(y - cy) <= r * 0.85) & (np.abs(x - cx) <= r * 0.85)
    else:
        mask = (y >= cy - r) & (y <= cy + r) & (np.abs(x - cx) <= (y - (cy - r)) / 2)
    image = np.full((size, size, 3), 30.0) + rng.normal(0, 4, (size, size, 3))
    image[mask] = colour
    return np.clip(image, 0, 255).astype(np.uint8)


def pixels(images: np.ndarray) -> torch.Tensor:
    """What ClipScorer feeds the model: squashed to the input size, normalised with mean = std = 0.5."""
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255
    x = F.interpolate(x, size=(CLIP_SIZE, CLIP_SIZE), mode="bilinear", antialias=True, align_corners=False)
    return (x - 0.5) / 0.5


def train_tokenizer(texts: list[str], *, wrap: bool = True):
    """A word-level tokenizer trained on `texts`, as a transformers fast tokenizer; `wrap` puts <s> ... </s>
    around every text, as CLIP's tokenizer does (CLIP pools the text at its end token)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=["<pad>", "<unk>", "<s>", "</s>"]))
    if wrap:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", special_tokens=[("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))]
        )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )


def build_tiny_clip(folder: Path, *, steps: int = 60) -> Path:
    """A tiny CLIP, contrastively trained for `steps` on the three concepts, saved like a real model folder."""
    captions = [f"a {name}" for name in CONCEPTS]
    vocab_texts = captions + [caption for pairs in CHECKLISTS.values() for pair in pairs for caption in pair]
    tokenizer = train_tokenizer(vocab_texts)
    torch.manual_seed(0)
    config = transformers.CLIPConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "max_position_embeddings": 24,
            "pad_token_id": 0,
            "bos_token_id": 2,
            "eos_token_id": 3,
        },
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": CLIP_SIZE,
            "patch_size": 8,
        },
        projection_dim=32,
    )
    model = transformers.CLIPModel(config)
    rng = np.random.default_rng(0)
    text = tokenizer(captions, padding=True, return_tensors="pt")
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    for _ in range(steps):
        images = np.stack([shape_image(name, rng=rng) for name in CONCEPTS])
        loss = model(**text, pixel_values=pixels(images), return_loss=True).loss
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    model.eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps({"image_mean": [0.5] * 3, "image_std": [0.5] * 3}))
    return folder


def write_video(path: Path, frames: np.ndarray, fps: int = 8) -> Path:
    writer = imageio_ffmpeg.write_frames(
        str(path),
        (frames.shape[2], frames.shape[1]),
        fps=fps,
        codec="libx264",
        macro_block_size=16,
        ffmpeg_log_level="error",
    )
    writer.send(None)
    for frame in frames:
        writer.send(np.ascontiguousarray(frame).tobytes())
    writer.close()
    return path


def concept_video(path: Path, name: str, *, frames: int = 9, seed: int = 0) -> Path:
    """The concept's shape drifting slowly right: a short real video of it."""
    rng = np.random.default_rng(seed)
    shots = [shape_image(name, rng=rng, centre=(32, 24 + 2 * i), radius=16) for i in range(frames)]
    return write_video(path, np.stack(shots))


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory) -> Path:
    return build_tiny_clip(tmp_path_factory.mktemp("tiny-clip"))


@pytest.fixture
def dqa_settings(clip_folder) -> Settings:
    return Settings(clip_model_path=clip_folder, torch_dtype="float32", dqa_frames=4, preference_base_model_path=None)


def cpu_residency() -> Residency:
    return Residency(budget_bytes=None, device="cpu")


# --- the grader -----------------------------------------------------------------------------------


def test_scores_every_axis_deterministically_with_models_kept_resident(dqa_settings, tmp_path):
    video = concept_video(tmp_path / "red.mp4", "red circle")
    residency = cpu_residency()
    grader = DQAGrader(settings=dqa_settings, residency=residency)
    first, grade = grader(actor=STUDIO, video=video, prompt="a red circle")
    again, grade_again = grader(actor=STUDIO, video=video, prompt="a red circle")
    fresh, _ = DQAGrader(settings=dqa_settings, residency=cpu_residency())(actor=STUDIO, video=video, prompt="a red circle")
    assert first == again == fresh and grade == grade_again
    assert set(first) >= {"semantic", "spatial", "benchmark", "multi_axis", "total", *BENCHMARK_METRICS, *MULTI_AXES}
    assert "preference" not in first  # no base model configured: the axis is off and its weight shared
    assert all(0.0 <= v <= 1.0 for v in first.values())
    assert grade == grades.of_total(first["total"])
    stats = residency.stats()
    assert (stats.loads, stats.hits) == (1, 1)  # one CLIP load for two videos: no load-and-unload per video


def test_a_video_that_shows_its_prompt_scores_above_one_that_does_not(dqa_settings, tmp_path):
    grader = DQAGrader(settings=dqa_settings, residency=cpu_residency())
    for name in CONCEPTS:
        video = concept_video(tmp_path / f"{name}.mp4", name)
        match, _ = grader(actor=STUDIO, video=video, prompt=f"a {name}")
        for other in CONCEPTS.keys() - {name}:
            mismatch, _ = grader(actor=STUDIO, video=video, prompt=f"a {other}")
            assert match["semantic"] > mismatch["semantic"] + 0.2, (name, other)
            assert match["spatial"] >= mismatch["spatial"], (name, other)  # best of 14 regions: may saturate both
            assert match["total"] > mismatch["total"], (name, other)


def test_region_grounding_finds_a_small_subject_the_whole_frame_hides(dqa_settings, tmp_path):
    rng = np.random.default_rng(3)
    small = [shape_image("blue square", rng=rng, centre=(14, 14), radius=9) for _ in range(5)]
    video = write_video(tmp_path / "small.mp4", np.stack(small))
    scores, _ = DQAGrader(settings=dqa_settings, residency=cpu_residency())(actor=STUDIO, video=video, prompt="a blue square")
    assert scores["spatial"] > scores["semantic"] + 0.3


# --- synthesis: grades and failure reasons --------------------------------------------------------------


# --- what cannot be graded -------------------------------------------------------------------------------


def test_unreadable_videos_raise_a_clear_error(dqa_settings, tmp_path):
    good = concept_video(tmp_path / "good.mp4", "green triangle").read_bytes()
    (tmp_path / "truncated.mp4").write_bytes(good[: len(good) // 2])
    (tmp_path / "junk.mp4").write_bytes(np.random.default_rng(0).bytes(4000))
    (tmp_path / "empty.mp4").write_bytes(b"")
    audio_only = tmp_path / "audio-only.mp4"  # a container with a stream, but no video frames
    subprocess.run(
        [
            imageio_ffmpeg.get_ffmpeg_exe(),
            "-loglevel",
            "error",
            "-f",
            "lavfi",
            "-i",
            "anullsrc=r=16000:cl=mono",
            "-t",
            "0.3",
            "-c:a",
            "aac",
            str(audio_only),
        ],
        check=True,
    )
    grader = DQAGrader(settings=dqa_settings, residency=cpu_residency())
    expected = {
        "truncated.mp4": "corrupt or truncated",
        "junk.mp4": "corrupt or truncated",
        "empty.mp4": "empty",
        "audio-only.mp4": "no video frames",
        "missing.mp4": "does not exist",
    }
    for name, what in expected.items():
        with pytest.raises(VideoUnreadable, match=what) as caught:
            grader(actor=STUDIO, video=tmp_path / name, prompt="a green triangle")
        assert "re-render" in str(caught.value)
    assert len(decode_video(tmp_path / "good.mp4")) == 9


# --- mas grade VIDEO ---------------------------------------------------------------------------------------


@pytest.mark.usefixtures("tmp_path")
def test_regrade_lays_out_every_axis_beside_the_stored_scores_and_writes_nothing(clean, clip_folder):
    settings = clean.model_copy(update={"clip_model_path": clip_folder, "torch_dtype": "float32", "dqa_frames": 4})
    video_path = settings.videos_dir / "batch-1" / "attempt.mp4"  # in the storage, where grading reads it
    video_path.parent.mkdir(parents=True, exist_ok=True)
    concept_video(video_path, "green triangle")
    with session_scope(settings) as session:
        video = one_video(session, request="Create 1 video of a green triangle", concept="a green triangle")
        session.add(
            Attempt(
                video_id=video.id,
                number=1,
                prompt="a green triangle",
                output_path=str(video_path),
                scores={"sharpness": 0.9, "total": 0.9},
                grade="A",
                grader="preview",
            )
        )
        video_id = video.id
    result = regrade(settings, video_id, residency=cpu_residency())
    assert (result.attempt, result.stored_grade, result.stored_grader) == (1, "A", "preview")
    assert [row.name for row in result.rows] == [
        "semantic",
        "spatial",
        "benchmark",
        *BENCHMARK_METRICS,
        "preference",
        "multi_axis",
        *MULTI_AXES,
        "total",
    ]
    weighted = {row.name: row.weight for row in result.rows if row.parent is None and row.name != "total"}
    assert weighted["preference"] == 0.0 and sum(weighted.values()) == pytest.approx(1.0)
    by_name = {row.name: row for row in result.rows}
    assert by_name["total"].score == result.total and by_name["total"].stored == 0.9
    assert by_name["motion_smoothness"].parent == "benchmark" and by_name["preference"].score is None
    assert result.grade == grades.of_total(result.total)
    scored = {row.name: row.score for row in result.rows if row.score is not None}
    assert result.failure_reasons == grading.failure_reasons(scored)
    with session_scope(settings) as session:
        assert session.scalars(sa.select(Attempt.grade)).one() == "A"
    with pytest.raises(GradingError, match="no video 999"):
        regrade(settings, 999, residency=cpu_residency())
