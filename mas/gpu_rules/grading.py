"""DQA synthesis (Phase 4): per-axis scores -> weighted total -> A-F grade -> failure reasons.

Pure functions on plain numbers, run on the CPU: the GPU phases (`gpu.dqa`) measure, this module decides.
Keeping the decision here means a grade can be recomputed from the scores stored on an attempt (with new
weights, say) without touching a model, and the Cameraman can name failures without importing torch.

The five weighted axes are those of the DQA whitepaper (section 7.4):

| axis         | what measures it                                                              | default weight |
|--------------|-------------------------------------------------------------------------------|----------------|
| `semantic`   | CLIPScore of sampled frames against the whole prompt, averaged over time      | 0.25           |
| `spatial`    | best CLIPScore of a frame region against each subject phrase (ProxyCLIP-like) | 0.15           |
| `benchmark`  | mean of the VBench-style metrics in `BENCHMARK_METRICS`                       | 0.20           |
| `preference` | sigmoid of the Tuner's DPO implicit reward for this prompt and concept        | 0.25           |
| `multi_axis` | mean of the VisionReward-style axes in `MULTI_AXES`                           | 0.15           |

`preference` exists only once the Tuner has promoted an adapter; until then it is left out and its weight
is shared among the other axes in proportion to theirs, rather than guessed, so a studio with no A/B
history is graded on what can be measured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from mas import grades
from mas.errors import InvalidInput, InvalidSettings, PermanentError, StudioError

AXES = ("semantic", "spatial", "benchmark", "preference", "multi_axis")
"""The weighted axes, in the order of `QualitySettings.dqa_weights` (w1..w5)."""

BENCHMARK_METRICS = ("subject_consistency", "motion_smoothness", "dynamic_degree", "imaging_quality")
"""Sub-scores of `benchmark`, each in [0, 1], in the spirit of VBench's quality dimensions."""

MULTI_AXES = ("aesthetic", "motion", "coherence", "fidelity")
"""Sub-scores of `multi_axis`, each in [0, 1], in the spirit of VisionReward's decomposition."""

WEAK_BELOW = 0.6
"""Scores under this are failures worth naming (a total of 0.6 is a C)."""

FAILURE_PHRASES = {
    "semantic": "frames do not show what the prompt describes",
    "spatial": "the prompt's subjects are missing or hard to find in the frame",
    "preference": "unlike the variations this user picks",
    "subject_consistency": "the subject changes appearance from frame to frame",
    "motion_smoothness": "jittery, unstable motion",
    "dynamic_degree": "almost no motion, a near-static shot",
    "imaging_quality": "noisy, soft frames",
    "aesthetic": "unappealing composition and lighting",
    "motion": "flicker and motion blur",
    "coherence": "the scene loses coherence over time",
    "fidelity": "blurry or distorted detail",
}
"""What a weak score means, as the Cameraman tells the Writer.

Phrases shared with the preview grader's ("jittery, unstable motion", "noisy, soft frames") are kept
word for word, so fixes and FAILURE_PATTERNS_TO_AVOID learned under one grader apply under the other.
"""

FIXES = {
    "frames do not show what the prompt describes": "the described scene shown plainly in every frame",
    "the prompt's subjects are missing or hard to find in the frame": "each named subject distinct and clearly framed",
    "unlike the variations this user picks": "in the manner of the user's chosen variations",
    "the subject changes appearance from frame to frame": "consistent subject appearance throughout",
    "jittery, unstable motion": "steady camera, smooth slow motion",
    "almost no motion, a near-static shot": "continuous visible motion",
    "noisy, soft frames": "sharp focus, fine detail",
    "unappealing composition and lighting": "balanced composition, cinematic lighting",
    "flicker and motion blur": "stable exposure, crisp motion",
    "the scene loses coherence over time": "one coherent scene from start to end",
    "blurry or distorted detail": "high fidelity, clean detailed textures",
}
"""The Writer's prompt fix for each failure phrase."""


class GradingError(StudioError):
    """A video could not be graded; the message says what to do.

    A file that cannot be decoded is `mas.video.VideoUnreadable` instead: the render step, both graders
    and the gallery meet it alike, and `evaluate_video` grades such a render F so review renders it again.
    """


class ModelMissing(GradingError, PermanentError):
    """A model path a DQA phase or the Tuner needs is unset or does not hold a model."""


class NothingToGrade(GradingError, InvalidInput):
    """`mas grade` named a video that does not exist or has not been rendered yet."""


class InvalidWeights(GradingError, InvalidSettings, ValueError):
    """MAS_DQA_WEIGHTS cannot weight the five axes (wrong count, negative, or no weight where it counts)."""


def model_folder(path: Path | None, *, variable: str, what: str) -> Path:
    """`path` checked to be a local transformers model folder, so a worker fails on its first task, clearly."""
    hint = f"set {variable} to a local folder holding {what} (transformers format, with config.json)"
    if path is None:
        raise ModelMissing(f"{variable} is unset: {hint}")
    if not (path / "config.json").is_file():
        raise ModelMissing(f"{path} is not a transformers model folder (no config.json): {hint}")
    return path


def check_weights(weights: Sequence[float]) -> tuple[float, ...]:
    """The five weights, validated: a bad MAS_DQA_WEIGHTS should fail loudly, not grade everything F."""
    values = tuple(float(w) for w in weights)
    if len(values) != len(AXES):
        raise InvalidWeights(f"MAS_DQA_WEIGHTS needs {len(AXES)} weights ({', '.join(AXES)}), got {len(values)}")
    if any(w < 0 for w in values) or sum(values) <= 0:
        raise InvalidWeights(f"MAS_DQA_WEIGHTS must be non-negative with a positive sum, got {values}")
    return values


def effective_weights(weights: Sequence[float], *, present: Sequence[str]) -> dict[str, float]:
    """Weights of the axes `present`, rescaled to sum to 1 (an absent axis hands its share to the others)."""
    named = dict(zip(AXES, check_weights(weights)))
    kept = {axis: named[axis] for axis in AXES if axis in present}
    total = sum(kept.values())
    if total <= 0:
        raise InvalidWeights(f"MAS_DQA_WEIGHTS gives weight 0 to every axis present ({', '.join(kept) or 'none'})")
    return {axis: w / total for axis, w in kept.items()}


def synthesize(measured: Mapping[str, float], *, weights: Sequence[float]) -> tuple[dict[str, float], str]:
    """Combine measured scores into the stored per-axis scores, their weighted total and its grade.

    `measured` holds `semantic`, `spatial`, every metric of BENCHMARK_METRICS and MULTI_AXES, and
    `preference` when a promoted adapter produced one. The returned scores hold all of those, the
    `benchmark` and `multi_axis` axes (means of their sub-scores) and `total`, rounded to 4 places.
    """
    required = ("semantic", "spatial", *BENCHMARK_METRICS, *MULTI_AXES)
    missing = [name for name in required if name not in measured]
    if missing:
        raise ValueError(f"cannot grade without {', '.join(missing)}")
    scores = {name: _unit(name, measured[name]) for name in required}
    if "preference" in measured:
        scores["preference"] = _unit("preference", measured["preference"])
    scores["benchmark"] = sum(scores[m] for m in BENCHMARK_METRICS) / len(BENCHMARK_METRICS)
    scores["multi_axis"] = sum(scores[m] for m in MULTI_AXES) / len(MULTI_AXES)
    share = effective_weights(weights, present=[axis for axis in AXES if axis in scores])
    scores["total"] = sum(share[axis] * scores[axis] for axis in share)
    rounded = {name: round(value, 4) for name, value in scores.items()}
    return rounded, grades.of_total(rounded["total"])


def failure_reasons(scores: Mapping[str, float], *, below: float = WEAK_BELOW, limit: int = 3) -> list[str]:
    """Readable phrases for the weakest scores under `below`, weakest first, at most `limit`.

    Only leaf scores are named: a weak `benchmark` is reported as the metric that pulled it down (say,
    motion smoothness), because that is what the Writer can fix. An empty list means nothing was weak.
    """
    weak = sorted((value, name) for name, value in scores.items() if name in FAILURE_PHRASES and value < below)
    return list(dict.fromkeys(FAILURE_PHRASES[name] for _, name in weak))[:limit]


def _unit(name: str, value: float) -> float:
    value = float(value)
    if not 0.0 <= value <= 1.0:  # NaN fails this too
        raise ValueError(f"score {name}={value} is outside [0, 1]")
    return value
