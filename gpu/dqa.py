"""Dynamic Quality Alignment on the gpu queue: measure a rendered video against its prompt and the user.

`DQAGrader` runs the phases of the DQA whitepaper (section 7.6) for one video, in order:

1. Verification (`gpu.dqa_phases.verify`): CLIP scores of sampled frames and their regions.
2. Benchmark (`gpu.dqa_phases.benchmark`): classical motion and imaging measurements, no model.
3. Preference: the Tuner's promoted DPO adapter scores the prompt for the video's concept
   (`gpu.preference_model`).
4. Synthesis, on the CPU: `mas.gpu_rules.grading.synthesize` weights the five axes into a total and a grade.

Models come from the residency manager, so they load once per worker process and stay on the GPU between
videos; nothing is loaded or unloaded per video. `regrade` re-runs the phases for `mas grade VIDEO`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import sqlalchemy as sa
import torch

from gpu.dqa_phases import ClipScorer, DQAConfig, benchmark, verify
from gpu.preference_model import PreferenceModel, preference_base, promoted_adapter
from gpu.residency import Residency
from mas.config import Settings
from mas.db import session_scope
from mas.domain.identity import Actor
from mas.gpu_rules import grading
from mas.gpu_rules.grading import AXES, BENCHMARK_METRICS, MULTI_AXES, ModelMissing, NothingToGrade
from mas.models import Attempt, Video
from mas.storage import local_copy
from mas.video import decode_video

NAME = "dqa"


def sample_indices(total: int, count: int) -> list[int]:
    """`count` frame indices spread evenly from first to last (all of them when there are fewer)."""
    return sorted({round(i) for i in np.linspace(0, total - 1, min(count, total))})


def multi_axis(measured: Mapping[str, float]) -> dict[str, float]:
    """VisionReward-style dimensions from Phase 1 checklist answers and Phase 2 measurements."""
    return {
        "aesthetic": measured["checklist_aesthetic"],
        "fidelity": measured["checklist_fidelity"],
        "motion": (measured["checklist_motion"] + measured["steadiness"]) / 2,
        "coherence": (measured["checklist_coherence"] + measured["semantic_stability"]) / 2,
    }


@dataclass(frozen=True, kw_only=True)
class DQAGrader:
    """Grades a rendered video: same call as PreviewGrader, plus the video's concept for the preference axis.

    Built per task (cheap); the models it uses live in `residency`, loaded on the first video a worker
    grades and kept there. The CLIP path is checked at construction, so a misconfigured worker fails on
    its first task with a message saying which setting to fix.
    """

    settings: Settings
    residency: Residency
    config: DQAConfig = field(default_factory=DQAConfig)
    name: str = NAME

    def __post_init__(self) -> None:
        self.clip_folder()
        grading.check_weights(self.settings.quality.dqa_weights)

    def clip_folder(self) -> Path:
        return grading.model_folder(
            self.settings.quality.clip_model_path,
            variable="MAS_CLIP_MODEL_PATH",
            what="a CLIP-family model (e.g. openai/clip-vit-large-patch14)",
        )

    @property
    def dtype(self) -> torch.dtype:
        return getattr(torch, self.settings.gpu.torch_dtype)

    def clip(self) -> ClipScorer:
        folder = self.clip_folder()
        key = f"dqa:clip:{self.settings.gpu.torch_dtype}:{folder}"
        return self.residency.get(key, loader=lambda: ClipScorer.load(folder, dtype=self.dtype))

    def preference_model(self, actor: Actor) -> PreferenceModel | None:
        """`actor`'s promoted adapter on its base model, resident; None while preference is off (no
        MAS_PREFERENCE_BASE_MODEL_PATH) or no adapter of theirs has been promoted yet."""
        if self.settings.quality.preference_base_model_path is None:
            return None
        base = preference_base(self.settings)
        adapter = promoted_adapter(self.settings, actor, base=base)
        if adapter is None:
            return None
        if not adapter.present:
            raise ModelMissing(
                f"the promoted preference adapter v{adapter.version} is missing from {adapter.path}; "
                "run `mas tune` to train and promote a new one"
            )
        # float32 whatever MAS_TORCH_DTYPE says (see PreferenceModel.load). Keyed by version: a newly
        # promoted adapter loads beside the old one, which the LRU evicts in time.
        key = f"dqa:preference:float32:{base}:v{adapter.version}"
        return self.residency.get(key, loader=lambda: PreferenceModel.load(base=base, adapter=adapter.path))

    def measure(self, *, video: Path, prompt: str, actor: Actor, concept: str = "") -> dict[str, float]:
        """Phases 1-3: every raw measurement, before synthesis."""
        decoded = decode_video(video)
        scorer = self.clip()
        frames = torch.from_numpy(decoded).to(scorer.device).permute(0, 3, 1, 2)  # uint8 on the device
        sampled = frames[sample_indices(len(frames), self.settings.quality.dqa_frames)].float().div(255)
        measured = verify(scorer, sampled, prompt=prompt, config=self.config)  # Phase 1
        measured |= benchmark(frames, sampled, config=self.config)  # Phase 2
        measured |= multi_axis(measured)
        if (preference := self.preference_model(actor)) is not None:  # Phase 3
            measured["preference"] = preference.score(concept=concept, prompt=prompt)
        return measured

    def __call__(self, *, video: Path, prompt: str, actor: Actor, concept: str = "") -> tuple[dict[str, float], str]:
        """(scores, grade): the five axes, their sub-scores and `total`; the grade by mas.gpu_rules.grading's cut-offs."""
        measured = self.measure(video=video, prompt=prompt, concept=concept, actor=actor)
        return grading.synthesize(measured, weights=self.settings.quality.dqa_weights)  # Phase 4, plain arithmetic


# --- regrade: `mas grade VIDEO` -------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class AxisRow:
    """One line of `mas grade`: a weighted axis (with its effective weight) or a sub-score of one."""

    name: str
    score: float | None
    weight: float | None = None
    parent: str | None = None
    stored: float | None = None


@dataclass(frozen=True, kw_only=True)
class Regrade:
    video_id: int
    attempt: int
    path: str
    concept: str
    prompt: str
    grade: str
    total: float
    stored_grade: str | None
    stored_grader: str
    rows: list[AxisRow]
    failure_reasons: list[str]


def regrade(settings: Settings, video_id: int, *, residency: Residency) -> Regrade:
    """Grade the video's latest rendered attempt again with DQA, now, and lay the result out per axis
    beside what is stored. Nothing is written: the attempt keeps the grade its review was based on."""
    with session_scope(settings) as session:
        video = session.get(Video, video_id)
        if video is None:
            raise NothingToGrade(f"there is no video {video_id}; `mas videos` lists them")
        row = session.execute(
            sa.select(Attempt)
            .where(Attempt.video_id == video_id, Attempt.output_path.is_not(None))
            .order_by(Attempt.number.desc())
            .limit(1)
        ).scalar_one_or_none()
        if row is None:
            raise NothingToGrade(f"video {video_id} has no rendered attempt yet; grade it once it has been rendered")
        concept, attempt, actor = video.concept, row, Actor(video.batch.user_name)
    path = local_copy(settings, attempt.output_path)
    if path is None:
        raise NothingToGrade(f"the file of video {video_id} ({attempt.output_path}) is not in the storage")
    grader = DQAGrader(settings=settings, residency=residency)
    scores, grade = grader(video=path, prompt=attempt.prompt, concept=concept, actor=actor)
    stored = attempt.scores or {}
    share = grading.effective_weights(settings.quality.dqa_weights, present=[a for a in AXES if a in scores])
    subs = {"benchmark": BENCHMARK_METRICS, "multi_axis": MULTI_AXES}
    rows: list[AxisRow] = []
    for axis in AXES:
        rows.append(AxisRow(name=axis, score=scores.get(axis), weight=share.get(axis, 0.0), stored=stored.get(axis)))
        rows.extend(AxisRow(name=m, score=scores[m], parent=axis, stored=stored.get(m)) for m in subs.get(axis, ()))
    rows.append(AxisRow(name="total", score=scores["total"], weight=1.0, stored=stored.get("total")))
    return Regrade(
        video_id=video_id,
        attempt=attempt.number,
        path=str(path),
        concept=concept,
        prompt=attempt.prompt,
        grade=grade,
        total=scores["total"],
        stored_grade=attempt.grade,
        stored_grader=attempt.grader,
        rows=rows,
        failure_reasons=grading.failure_reasons(scores),
    )
