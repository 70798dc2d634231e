"""How a grading's measured scores become a total, a grade and failure reasons (`mas.gpu_rules.grading`). Pure code."""

from __future__ import annotations

import math

import pytest

from mas import grades
from mas.gpu_rules import grading
from mas.gpu_rules.grading import AXES, BENCHMARK_METRICS, MULTI_AXES


def measured(**overrides: float) -> dict[str, float]:
    values = dict.fromkeys(("semantic", "spatial", *BENCHMARK_METRICS, *MULTI_AXES), 0.8)
    return {**values, **overrides}


def test_synthesis_weights_the_five_axes_and_shares_an_absent_ones_weight():
    weights = (0.25, 0.15, 0.20, 0.25, 0.15)
    scores, grade = grading.synthesize(measured(semantic=1.0, spatial=0.5, preference=0.2), weights=weights)
    expected = 0.25 * 1.0 + 0.15 * 0.5 + 0.20 * 0.8 + 0.25 * 0.2 + 0.15 * 0.8
    assert scores["total"] == pytest.approx(expected, abs=1e-4) and grade == grades.of_total(expected)
    assert scores["benchmark"] == pytest.approx(0.8) and scores["multi_axis"] == pytest.approx(0.8)
    without, _ = grading.synthesize(measured(semantic=1.0, spatial=0.5), weights=weights)
    assert without["total"] == pytest.approx((0.25 * 1.0 + 0.15 * 0.5 + 0.20 * 0.8 + 0.15 * 0.8) / 0.75, abs=1e-4)
    only_semantic, _ = grading.synthesize(measured(semantic=0.3), weights=(1, 0, 0, 0, 0))
    assert only_semantic["total"] == pytest.approx(0.3)


@pytest.mark.parametrize("weights", [(0.5, 0.5), (0.25, -0.15, 0.2, 0.25, 0.15), (0, 0, 0, 0, 0)])
def test_bad_weights_are_refused(weights):
    with pytest.raises(ValueError, match="MAS_DQA_WEIGHTS"):
        grading.synthesize(measured(), weights=weights)


def test_scores_outside_the_unit_interval_are_refused():
    with pytest.raises(ValueError, match="outside"):
        grading.synthesize(measured(semantic=math.nan), weights=(0.25, 0.15, 0.20, 0.25, 0.15))


def test_failure_reasons_name_the_weakest_leaf_scores_first():
    scores, _ = grading.synthesize(
        measured(motion_smoothness=0.1, semantic=0.3, imaging_quality=0.5, aesthetic=0.59, fidelity=0.65),
        weights=(0.25, 0.15, 0.20, 0.25, 0.15),
    )
    assert grading.failure_reasons(scores) == [
        "jittery, unstable motion", "frames do not show what the prompt describes", "noisy, soft frames",
    ]
    assert grading.failure_reasons(scores, limit=10)[-1] == "unappealing composition and lighting"
    assert grading.failure_reasons(grading.synthesize(measured(), weights=(1, 1, 1, 1, 1))[0]) == []
    assert all(phrase in grading.FIXES for phrase in grading.FAILURE_PHRASES.values())
    assert set(AXES) - {"benchmark", "multi_axis"} <= set(grading.FAILURE_PHRASES)
