"""The one grade scale, A best to F worst, and the totals each grade starts at. Both graders grade through it,
and MIN_ACCEPTABLE_GRADE, the quality_standards block and the Cameraman's rule read it."""

from __future__ import annotations

from typing import Literal, get_args

Grade = Literal["A", "B", "C", "D", "F"]
GRADES: tuple[Grade, ...] = get_args(Grade)
"""Best first."""

CUTOFFS: tuple[tuple[Grade, float], ...] = (("A", 0.85), ("B", 0.70), ("C", 0.55), ("D", 0.40))
"""Lowest total for each grade; below the last one the grade is F: A >= 0.85, B >= 0.70, C >= 0.55, D >= 0.40.
Whichever grader runs (preview or DQA), MIN_ACCEPTABLE_GRADE means the same."""


def of_total(total: float) -> Grade:
    """The grade of a weighted total in [0, 1]."""
    return next((grade for grade, cutoff in CUTOFFS if total >= cutoff), "F")


def at_least(grade: str, minimum: str) -> bool:
    """True when `grade` is as good as `minimum` or better."""
    scale: tuple[str, ...] = GRADES
    return scale.index(grade) <= scale.index(minimum)
