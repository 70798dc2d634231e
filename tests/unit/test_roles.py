"""The Cameraman and the consolidator over a stub asker (`Scripted`), with no process and no server: the
studio's rule decides every verdict, a model's reasons are kept beside the grader's when they are reasons,
a reply that never validates leaves the rule alone, and a consolidation is the model's own."""

from __future__ import annotations

import pytest

from mas.agents.asking import AskingCameraman, AskingConsolidator
from mas.agents.replies import NoValidReply
from mas.agents.roles import ReviewBrief
from mas.agents.studio_rules import studio_verdict
from tests.unit.scripted import Scripted

WEAK = {"sharpness": 0.4, "smoothness": 0.9, "palette": 0.9}


def review(asker: Scripted, *, grade: str, attempt: int = 1):
    brief = ReviewBrief(grade=grade, scores=WEAK, min_grade="B", attempt=attempt, max_retries=3)
    return AskingCameraman(asker).review(brief)


def test_a_grade_at_the_minimum_is_accepted_whatever_the_model_says():
    verdict = review(Scripted({"action": "fail", "failure_reasons": ["too dark"]}), grade="A")
    assert (verdict.action, verdict.failure_reasons, verdict.source) == ("accept", [], "model")


def test_a_weak_attempt_is_refined_with_the_graders_reasons_and_the_models_own():
    asker = Scripted(
        {"action": "accept", "failure_reasons": ["the dragon's wings smear"], "strategy": "freeze the wings"}
    )
    verdict = review(asker, grade="D")
    rule = studio_verdict(ReviewBrief(grade="D", scores=WEAK, min_grade="B", attempt=1, max_retries=3))
    assert verdict.action == "refine" == rule.action
    assert verdict.failure_reasons == [*rule.failure_reasons, "the dragon's wings smear"]
    assert rule.strategy in verdict.strategy and "freeze the wings" in verdict.strategy
    assert asker.asked[0].task == "review" and asker.asked[0].payload["attempt"] == 1


def test_the_last_attempt_fails_even_when_the_model_would_refine():
    verdict = review(Scripted({"action": "refine", "failure_reasons": ["soft focus"]}), grade="D", attempt=3)
    assert verdict.action == "fail" and verdict.strategy == ""


def test_a_reason_that_echoes_the_task_is_not_kept():
    verdict = review(
        Scripted({"action": "refine", "failure_reasons": ["grade min_grade attempt max_retries"]}), grade="D"
    )
    assert "grade min_grade attempt max_retries" not in verdict.failure_reasons


def test_a_review_that_never_validates_is_the_rule_alone_and_says_so():
    verdict = review(Scripted({"action": "maybe"}, "not json at all"), grade="D")
    rule = studio_verdict(ReviewBrief(grade="D", scores=WEAK, min_grade="B", attempt=1, max_retries=3))
    assert (verdict.action, verdict.failure_reasons) == (rule.action, rule.failure_reasons)
    assert verdict.source == "studio" and "never validated" in verdict.note


def test_a_consolidation_is_the_models_summary_and_learnings():
    asker = Scripted({"summary": "Two dragons accepted; one lighthouse refined.", "learnings": ["slow dolly-ins work"]})
    done = AskingConsolidator(asker).consolidate(activity=["accepted: a dragon", "refined: a lighthouse"])
    assert done.summary == "Two dragons accepted; one lighthouse refined." and done.learnings == ["slow dolly-ins work"]
    assert asker.asked[0].payload["activity"] == ["accepted: a dragon", "refined: a lighthouse"]


def test_a_consolidation_without_a_summary_is_no_reply():
    with pytest.raises(NoValidReply):
        AskingConsolidator(Scripted({"learnings": ["x"]}, {"summary": ""})).consolidate(activity=["accepted: a"])
