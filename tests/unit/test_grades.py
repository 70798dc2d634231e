"""The one grade scale: each total's grade at the cutoffs, and which grades meet a minimum. Pure code."""

from __future__ import annotations

import pytest

from mas import grades


@pytest.mark.parametrize(
    ("total", "grade"),
    [(1.0, "A"), (0.85, "A"), (0.8499, "B"), (0.70, "B"), (0.55, "C"), (0.40, "D"), (0.3999, "F"), (0.0, "F")],
)
def test_a_total_gets_the_grade_whose_cutoff_it_reaches(total, grade):
    assert grades.of_total(total) == grade


@pytest.mark.parametrize(
    ("grade", "minimum", "meets"),
    [("A", "B", True), ("B", "B", True), ("C", "B", False), ("F", "A", False), ("D", "F", True)],
)
def test_a_grade_meets_a_minimum_when_it_is_as_good_or_better(grade, minimum, meets):
    assert grades.at_least(grade, minimum) is meets


def test_the_scale_runs_best_first_and_every_grade_but_f_has_a_cutoff():
    assert grades.GRADES == ("A", "B", "C", "D", "F")
    assert [g for g, _ in grades.CUTOFFS] == list(grades.GRADES[:-1])
    assert [c for _, c in grades.CUTOFFS] == sorted((c for _, c in grades.CUTOFFS), reverse=True)
