"""The four roles played by a model that answers `Question`s: the Director, Writer, Cameraman, Consolidator.

A backend supplies an `Asker` per role (the Letta server's agents, or an OpenAI-compatible chat endpoint
with the studio's own memory); the questions, their rules and the reading of the validated replies are
here once, so both backends behave the same way and are tested the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Protocol, TypeVar

from pydantic import BaseModel

from mas.agents.protocol import Question
from mas.agents.replies import (
    CandidatesReply,
    ConsolidationReply,
    DraftReply,
    PlanReply,
    StyleReply,
    VerdictReply,
)
from mas.agents.roles import (
    Consolidation,
    Draft,
    Plan,
    PlannedVideo,
    StylePreferences,
    Verdict,
    WriterBrief,
    draft_seed,
)
from mas.config import grade_at_least
from mas.pipeline.requests import ProductionRequest

log = logging.getLogger(__name__)

R = TypeVar("R", bound=BaseModel)


class Asker(Protocol):
    """One agent: sends a question, returns its reply validated by `question.reply` (or raises)."""

    def ask(self, question: Question) -> BaseModel: ...


Ranker = Callable[[str, Sequence[str]], list[float]]
"""(concept, candidate prompts) -> a score per candidate, higher is what the user is likelier to pick."""


class AskingDirector:
    """Plans batches, series and A/B tests, and reads style feedback."""

    def __init__(self, asker: Asker) -> None:
        self._asker = asker

    def plan(self, request: ProductionRequest, *, episodes_done: int = 0, batch_id: int | None = None) -> Plan:
        rules = f"exactly {request.count} videos, each a distinct concept on the theme. " + {
            "ab": "kind ab: variations of one concept, each with a distinct camera/visual approach.",
            "series": f"kind series: episodes {episodes_done + 1} to {episodes_done + request.count} of "
            "one story; give the series style, consistency rules and recurring elements.",
        }.get(request.kind, "approach empty.")
        reply = self._asker.ask(
            Question(
                task="plan",
                payload={"request": request.to_json(), "episodes_done": episodes_done},
                shape='{"videos": [{"concept": str, "approach": str}], "series_style": str, '
                '"consistency_rules": [str], "series_elements": [str]}',
                reply=PlanReply,
                rules=rules,
                context={"count": request.count},
                batch_id=batch_id,
            )
        )
        assert isinstance(reply, PlanReply)
        return Plan(
            videos=[
                PlannedVideo(  # the studio's labels, in order
                    concept=v.concept,
                    label=chr(ord("A") + i) if request.kind == "ab" else None,
                    approach=v.approach,
                )
                for i, v in enumerate(reply.videos)
            ],
            series_style=reply.series_style,
            consistency_rules=reply.consistency_rules,
            series_elements=reply.series_elements,
        )

    def read_style(self, feedback: str) -> StylePreferences:
        reply = self._asker.ask(
            Question(
                task="read_style",
                payload={"feedback": feedback},
                shape='{"colors": str, "moods": str, "themes": str, "pacing": str, "disliked": [str]}',
                reply=StyleReply,
                rules="comma-separated words for colors, moods, themes and pacing, empty when not mentioned; "
                "disliked: the opposite aesthetics the feedback rules out.",
            )
        )
        assert isinstance(reply, StyleReply)
        return StylePreferences(**reply.model_dump())


WRITE_RULES = (
    "apply user_style and the series rules; prevent failure_patterns and what past_failures show; learn "
    "from past_successes; on a retry fix previous_failures; never name anything in "
    "user_style.DISLIKED_ELEMENTS in the prompt; negative_prompt lists what to avoid."
)


class AskingWriter:
    """Writes each attempt's prompt; the seed is the studio's, not the model's.

    With `candidates` > 1 the model proposes several prompts and `rank` (the user's learned taste) picks
    the one the user is likeliest to prefer; without a ranker the model's first candidate wins.
    """

    def __init__(self, asker: Asker, *, candidates: int = 1, rank: Ranker | None = None) -> None:
        self._asker, self._candidates, self._rank = asker, candidates, rank

    def write(self, brief: WriterBrief) -> Draft:
        payload = {"brief": {k: v for k, v in asdict(brief).items() if k != "video_id"}}
        if self._candidates <= 1:
            reply = self._asker.ask(
                Question(
                    task="write",
                    payload=payload,
                    shape='{"prompt": str, "negative_prompt": str}',
                    reply=DraftReply,
                    rules=WRITE_RULES,
                    video_id=brief.video_id,
                )
            )
            assert isinstance(reply, DraftReply)
            return Draft(prompt=reply.prompt, negative_prompt=reply.negative_prompt, seed=draft_seed(brief))
        reply = self._asker.ask(
            Question(
                task="write",
                payload=payload,
                shape='{"candidates": [{"prompt": str, "negative_prompt": str}]}',
                reply=CandidatesReply,
                context={"count": self._candidates},
                rules=f"{self._candidates} distinct candidate prompts; " + WRITE_RULES,
                video_id=brief.video_id,
            )
        )
        assert isinstance(reply, CandidatesReply)
        best = reply.candidates[0]
        if self._rank is not None:
            scores = self._rank(brief.concept, [c.prompt for c in reply.candidates])
            best = reply.candidates[max(range(len(scores)), key=scores.__getitem__)]
            log.info("writer: %d candidates scored %s by the user's taste", len(scores), [round(s, 3) for s in scores])
        return Draft(prompt=best.prompt, negative_prompt=best.negative_prompt, seed=draft_seed(brief))


class AskingCameraman:
    """Judges attempts; never accepts below the minimum grade, never refines past the retry limit."""

    def __init__(self, asker: Asker) -> None:
        self._asker = asker

    def review(
        self,
        *,
        grade: str,
        scores: dict[str, float],
        min_grade: str,
        attempt: int,
        max_retries: int,
        video_id: int | None = None,
    ) -> Verdict:
        reply = self._asker.ask(
            Question(
                task="review",
                payload={
                    "grade": grade,
                    "scores": scores,
                    "min_grade": min_grade,
                    "attempt": attempt,
                    "max_retries": max_retries,
                },
                shape='{"action": "accept"|"refine"|"fail", "failure_reasons": [str], "strategy": str}',
                reply=VerdictReply,
                video_id=video_id,
                rules="grades run A (best) to F; accept when grade is min_grade or better; otherwise name the weak "
                "axes as failure_reasons and refine with a strategy while attempt < max_retries, else fail.",
            )
        )
        assert isinstance(reply, VerdictReply)
        action = reply.action
        if action == "accept" and not grade_at_least(grade, min_grade):  # the studio's standard holds
            log.info("cameraman accepted grade %s below the minimum %s; refining instead", grade, min_grade)
            action = "refine"
        if action == "refine" and attempt >= max_retries:
            log.info("cameraman asked to refine attempt %d of %d; failing instead", attempt, max_retries)
            action = "fail"
        return Verdict(
            action=action,
            failure_reasons=reply.failure_reasons,
            strategy=reply.strategy if action == "refine" else "",
        )


class AskingConsolidator:
    """Summarizes recent activity into a summary and learnings (the sleeptime run)."""

    def __init__(self, asker: Asker) -> None:
        self._asker = asker

    def consolidate(self, *, activity: list[str], conversations: Sequence[str] = ()) -> Consolidation:
        reply = self._asker.ask(
            Question(
                task="consolidate",
                payload={"activity": activity, "conversations": list(conversations)},
                shape='{"summary": str, "learnings": [str]}',
                reply=ConsolidationReply,
                rules="summary: what was produced since the last consolidation, in one or two sentences "
                "(conversations: what the crew's conversations answered meanwhile); "
                "learnings: at most three reusable lessons about what made prompts succeed or fail (may be empty).",
            )
        )
        assert isinstance(reply, ConsolidationReply)
        return Consolidation(summary=reply.summary, learnings=reply.learnings)
