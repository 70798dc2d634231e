"""The four roles played by a model that answers `Question`s: the Director, Writer, Cameraman, Consolidator.

A backend supplies an `Asker` per role (the Letta server's agents, or an OpenAI-compatible chat endpoint
with the studio's own memory); the questions, their rules and the reading of the validated replies are
here once, so both backends behave the same way and are tested the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, fields, replace
from typing import Protocol, TypeVar

from pydantic import BaseModel

from mas.agents import checks, prompt_check, reading, studio_rules, style_check, style_reader
from mas.agents.protocol import (
    CONSOLIDATE_TOKENS,
    PLAN_TOKENS,
    PLAN_TOKENS_PER_VIDEO,
    REVIEW_TOKENS,
    STYLE_TOKENS,
    TRANSLATE_TOKENS,
    WRITE_TOKENS,
    Question,
    Reply,
)
from mas.agents.replies import (
    CandidatesReply,
    ConsolidationReply,
    DraftReply,
    EnglishReply,
    NoValidReply,
    PlanReply,
    StyleReply,
    VerdictReply,
)
from mas.agents.roles import (
    Consolidation,
    Draft,
    Plan,
    PlannedVideo,
    Reading,
    ReviewBrief,
    Verdict,
    WriterBrief,
    draft_seed,
)
from mas.agents.style import Style
from mas.agents.style_check import Meaning
from mas.domain.requests import ProductionRequest

log = logging.getLogger(__name__)

R = TypeVar("R", bound=BaseModel)


class Asker(Protocol):
    """One agent: sends a question, returns its reply validated by `question.reply` (or raises)."""

    def ask(self, question: Question[Reply]) -> Reply: ...


Ranker = Callable[[str, Sequence[str]], list[float]]
"""(concept, candidate prompts) -> a score per candidate, higher is what the user is likelier to pick."""


PLAN_SHAPE = (
    '{"videos": [{"concept": str, "approach": str}], "series_style": str, '
    '"consistency_rules": [str], "series_elements": [str]}'
)
STYLE_SHAPE = (
    '{"liked": [{"aspect": "colour"|"mood"|"theme"|"pacing"|"other", "words": str}], '
    '"ruled_out": [{"aspect": "colour"|"mood"|"theme"|"pacing"|"other", "words": str}]}'
)
STYLE_RULES = (
    "liked: what the feedback asks for; ruled_out: what it rejects (no, not, never, avoid, hate, too much); "
    "each item one preference in a few English words, whatever the feedback's language; only what the "
    "feedback says (no opposites it does not say); empty lists when it names no style."
)
TRANSLATE_SHAPE = '{"english": str}'
TRANSLATE_RULES = "english: the feedback said in plain English, every no, not and never kept; nothing added."


class AskingDirector:
    """Plans batches, series and A/B tests, and reads style feedback.

    The plan keeps the studio's promises whatever the model says: as many videos as asked, each concept
    distinct and about the theme (an echo or a repeat is replaced by the studio's concept for that place);
    a plan that never validates is the studio's. Style feedback is read by the model: the studio checks
    the reading's structure and grounding, never its polarity.
    """

    def __init__(self, asker: Asker, *, meaning: Meaning | None = None) -> None:
        self._asker, self._meaning = asker, meaning

    def plan(self, request: ProductionRequest, *, episodes_done: int = 0, batch_id: int | None = None) -> Plan:
        rules = f"exactly {request.count} videos, each a distinct concept on the theme. " + {
            "ab": "kind ab: variations of one concept, each with a distinct camera/visual approach.",
            "series": f"kind series: episodes {episodes_done + 1} to {episodes_done + request.count} of "
            "one story; give the series style, consistency rules and recurring elements.",
        }.get(request.kind, "approach empty.")
        studio = studio_rules.studio_plan(request, episodes_done=episodes_done)
        try:
            reply = self._asker.ask(
                Question(
                    task="plan",
                    payload={"request": request.to_json(), "episodes_done": episodes_done},
                    shape=PLAN_SHAPE,
                    reply=PlanReply,
                    rules=rules,
                    context={"count": request.count},
                    batch_id=batch_id,
                    max_tokens=PLAN_TOKENS_PER_VIDEO * request.count + PLAN_TOKENS,
                )
            )
        except NoValidReply as error:
            log.warning("director: the plan never validated; the studio plans batch %s itself: %s", batch_id, error)
            return studio
        task_words = checks.vocabulary(rules, PLAN_SHAPE)
        seen: set[str] = set()
        videos: list[PlannedVideo] = []
        for i, (model, own) in enumerate(zip(reply.videos, studio.videos, strict=True)):
            concept = model.concept if request.kind != "ab" else own.concept  # ab: one concept, the request's
            key = " ".join(checks.content_words(concept))
            if request.kind != "ab" and (
                checks.is_echo(concept, task_words)
                or key in seen
                or not checks.about_request(concept, request.theme, task_text=rules + PLAN_SHAPE, meaning=self._meaning)
            ):
                log.info(
                    "director: concept %d %r is a repeat or not about the request; the studio's instead", i, concept
                )
                concept = own.concept
            seen.add(" ".join(checks.content_words(concept)))
            approach = model.approach if request.kind == "ab" else ""
            taken = [v.approach for v in videos]
            if request.kind == "ab" and (not approach or checks.is_echo(approach, task_words) or approach in taken):
                approach = own.approach
            videos.append(PlannedVideo(concept=concept, label=own.label, approach=approach))
        if request.kind != "series":
            return Plan(videos=videos)
        return Plan(
            videos=videos,
            series_style=(checks.sensible([reply.series_style], task_words) or [studio.series_style])[0],
            consistency_rules=checks.sensible(reply.consistency_rules, task_words) or studio.consistency_rules,
            series_elements=checks.sensible(reply.series_elements, task_words) or studio.series_elements,
        )

    def read_style(self, feedback: str) -> Reading:
        """The model's reading, checked for its structure and grounding only (`mas.agents.reading`): its
        polarity stands, where the studio's own reader reads otherwise too (recorded in `disagreements`).

        Feedback the studio does not read (another language or script) is grounded in the model's own English
        for it; without a usable English the reading is checked for its structure only. A reading that never
        validates is no reading: the feedback is not understood, never read by the studio's rules instead.
        """
        task_words = checks.vocabulary(STYLE_RULES, STYLE_SHAPE)
        english = feedback if style_reader.reads(feedback) else self._english(feedback)
        read_from = english or feedback

        def check(reply: StyleReply) -> list[str]:
            return reading.problems(reply, feedback=read_from, task_words=task_words)

        note = "" if english in (None, feedback) else f"checked against the model's English: {english!r}"
        try:
            reply = self._asker.ask(
                Question(
                    task="read_style",
                    payload={"feedback": feedback},
                    shape=STYLE_SHAPE,
                    reply=StyleReply,
                    rules=STYLE_RULES,
                    context={"check": check},
                    max_tokens=STYLE_TOKENS,
                    alone=True,
                )
            )
        except NoValidReply as error:
            log.warning("director: the style reading never validated; the feedback is not understood: %s", error)
            return Reading(
                items=[],
                source="model",
                note="; ".join(filter(None, [f"the model's readings never validated: {error}", note])),
                not_understood=[feedback],
            )
        items = reading.items_of(reply)
        named = style_reader.style_words(read_from)
        if not items and named:  # a model that reads nothing where the feedback names styles did not read it
            log.info("director: the model read no preference in feedback that names %s: not understood", named)
            return Reading(
                items=[],
                source="model",
                note="; ".join(
                    filter(None, [f"the model read no preference; the feedback names {', '.join(named)}", note])
                ),
                not_understood=[feedback],
            )
        differ = reading.disagreements(items, read_from)
        if differ:
            log.info(
                "director: the studio's reader reads the feedback otherwise; the model's reading stands: %s", differ
            )
        return Reading(items=items, source="model", note=note, disagreements=differ)

    def _english(self, feedback: str) -> str | None:
        """The model's English for feedback the studio does not read; None when it gives none the studio reads."""

        def check(reply: EnglishReply) -> list[str]:
            if checks.MARKERS.search(reply.english) or not style_reader.reads(reply.english):
                return ["english: give the feedback in plain English words"]
            return []

        try:
            reply = self._asker.ask(
                Question(
                    task="translate",
                    payload={"feedback": feedback},
                    shape=TRANSLATE_SHAPE,
                    reply=EnglishReply,
                    rules=TRANSLATE_RULES,
                    context={"check": check},
                    max_tokens=TRANSLATE_TOKENS,
                    alone=True,
                )
            )
        except NoValidReply as error:
            log.info("director: no English for the feedback; its reading is checked for structure only: %s", error)
            return None
        return reply.english


WRITE_RULES = (
    "apply user_style and the series rules; prevent failure_patterns and what past_failures show; learn "
    "from past_successes; on a retry fix previous_failures; never name anything in "
    "user_style.DISLIKED_ELEMENTS in the prompt; negative_prompt lists what to avoid."
)
DRAFT_SHAPE = '{"prompt": str, "negative_prompt": str}'
WRITE_WORDS = checks.vocabulary(WRITE_RULES, DRAFT_SHAPE, " ".join(f.name for f in fields(WriterBrief)))
"""What a prompt that hands the write task back is made of."""


class AskingWriter:
    """Writes each attempt's prompt; the seed is the studio's, not the model's.

    With `candidates` > 1 the model proposes several prompts and `rank` (the user's learned taste) picks
    the one the user is likeliest to prefer among those that are prompts; without a ranker the first wins.

    Whatever the model writes, the prompt that leaves here is a prompt for the concept (a draft that is
    not is asked again once, then the studio writes its own), carries the user's colour, mood and pacing
    and none of the disliked elements, and on a refinement the fixes of the last attempt's failures (a
    draft that misses any is asked again once with what is missing, then repaired by the studio). A write
    that never validates is the studio's own prompt. `Draft.source` says which happened.
    """

    def __init__(
        self, asker: Asker, *, candidates: int = 1, rank: Ranker | None = None, meaning: Meaning | None = None
    ) -> None:
        self._asker, self._candidates, self._rank, self._meaning = asker, candidates, rank, meaning
        self._checked: dict[str, style_check.StyleCheck] = {}

    def write(self, brief: WriterBrief) -> Draft:
        self._checked = {}
        try:
            return self._write(brief)
        except NoValidReply as error:
            log.warning("writer: no valid reply for video %s; the studio writes its prompt: %s", brief.video_id, error)
            return replace(studio_rules.studio_prompt(brief), note=f"the model's replies never validated: {error}")

    def _write(self, brief: WriterBrief) -> Draft:
        draft = self._ask(brief)
        problems = self._problems(draft, brief)
        if problems:
            draft = self._ask(brief, last=draft, problems=problems)
            problems = self._problems(draft, brief)
            if problems:
                note = f"the model's prompt was refused twice: {'; '.join(problems)}"
                log.info("writer: video %s: %s; the studio writes its prompt", brief.video_id, note)
                return replace(studio_rules.studio_prompt(brief), note=note)
        missing = self._missing(draft, brief)
        if missing:
            try:
                again = self._ask(brief, last=draft, problems=missing)
            except NoValidReply as error:  # the draft in hand is a prompt: repair it rather than drop it
                log.info(
                    "writer: video %s: no valid correction (%s); the studio repairs the draft", brief.video_id, error
                )
                again = draft
            if not self._problems(again, brief):
                draft = again
            still = self._missing(draft, brief)
            check = self._check(draft, brief)
            # the studio cannot repair what it cannot read; an English prompt the model cleared of the items the
            # studio was unsure of is read, and repaired, by the studio
            readable = bool(check.unsure) and not check.problems()
            if still and check.by == "model" and not readable:
                note = f"the model's prompt, checked by the model, still misses the style: {'; '.join(still)}"
                log.info("writer: video %s: %s; the studio writes its prompt", brief.video_id, note)
                return replace(studio_rules.studio_prompt(brief), note=note)
            if still:
                prompt = style_check.repair(draft.prompt, Style.of(brief.user_style), self._meaning)
                prompt = style_check.appended(
                    prompt, checks.missing_fixes(prompt, studio_rules.fixes_for(brief.previous_failures))
                )
                log.info("writer: video %s: the studio repaired the prompt: %s", brief.video_id, "; ".join(still))
                return replace(draft, prompt=prompt, source="repaired", note="; ".join(still))
        checked = self._check(draft, brief)
        return replace(draft, style_check=checked.as_json()) if checked.by == "model" else draft

    def _check(self, draft: Draft, brief: WriterBrief) -> style_check.StyleCheck:
        """The draft against the user's style: the studio's check, or the model's where the studio cannot read
        the prompt (asked once per prompt)."""
        if draft.prompt not in self._checked:
            self._checked[draft.prompt] = prompt_check.checked(
                self._asker, draft.prompt, Style.of(brief.user_style), self._meaning, video_id=brief.video_id
            )
        return self._checked[draft.prompt]

    def _problems(self, draft: Draft, brief: WriterBrief) -> list[str]:
        return checks.prompt_problems(
            draft.prompt, concept=brief.concept, task_words=WRITE_WORDS, previous=brief.previous_prompt
        )

    def _missing(self, draft: Draft, brief: WriterBrief) -> list[str]:
        """What the draft misses of the user's style and of the fixes this refinement needs."""
        fixes = checks.missing_fixes(draft.prompt, studio_rules.fixes_for(brief.previous_failures))
        return self._check(draft, brief).problems() + (
            [f"the prompt must fix the last attempt's failures with: {'; '.join(fixes)}"] if fixes else []
        )

    def _ask(self, brief: WriterBrief, *, last: Draft | None = None, problems: Sequence[str] = ()) -> Draft:
        """The model's draft (its negative prompt completed by the studio's), first or corrected."""
        shown = {k: v for k, v in asdict(brief).items() if k != "video_id"}
        shown["user_style"] = {k: v for k, v in brief.user_style.items() if k not in ("ITEMS", "ITEM_HISTORY")}
        shown["past_successes"] = studio_rules.craft_of(brief.past_successes)  # how they were made, not their subject
        payload: dict = {"brief": shown}
        rules = WRITE_RULES
        if last is not None:
            payload |= {"your_last_prompt": last.prompt, "problems": list(problems)}
            rules = "rewrite your_last_prompt so that it has none of the problems; " + WRITE_RULES
        if self._candidates > 1 and last is None:
            candidates = self._asker.ask(
                Question(
                    task="write",
                    payload=payload,
                    shape='{"candidates": [{"prompt": str, "negative_prompt": str}]}',
                    reply=CandidatesReply,
                    context={"count": self._candidates},
                    rules=f"{self._candidates} distinct candidate prompts; " + rules,
                    video_id=brief.video_id,
                    max_tokens=WRITE_TOKENS * self._candidates,
                )
            )
            chosen = self._choose(brief, candidates.candidates)
        else:
            chosen = self._asker.ask(
                Question(
                    task="write",
                    payload=payload,
                    shape=DRAFT_SHAPE,
                    reply=DraftReply,
                    rules=rules,
                    video_id=brief.video_id,
                    max_tokens=WRITE_TOKENS,
                )
            )
        negative = [*checks.sensible([chosen.negative_prompt], WRITE_WORDS), studio_rules.studio_negative(brief)]
        return Draft(
            prompt=chosen.prompt,
            negative_prompt=", ".join(dict.fromkeys(n for n in negative if n)),
            seed=draft_seed(brief),
        )

    def _choose(self, brief: WriterBrief, candidates: list[DraftReply]) -> DraftReply:
        """The candidate the user's taste prefers among those that are prompts (the first when none is)."""
        fine = [c for c in candidates if not self._problems(Draft(prompt=c.prompt, negative_prompt="", seed=0), brief)]
        pool = fine or candidates[:1]
        if self._rank is None or len(pool) == 1:
            return pool[0]
        scores = self._rank(brief.concept, [c.prompt for c in pool])
        log.info("writer: %d candidates scored %s by the user's taste", len(scores), [round(s, 3) for s in scores])
        return pool[max(range(len(scores)), key=scores.__getitem__)]


REVIEW_SHAPE = '{"action": "accept"|"refine"|"fail", "failure_reasons": [str], "strategy": str}'
REVIEW_RULES = (
    "grades run A (best) to F; accept when grade is min_grade or better; otherwise name the weak "
    "axes as failure_reasons and refine with a strategy while attempt < max_retries, else fail."
)
REVIEW_WORDS = checks.vocabulary(REVIEW_RULES, REVIEW_SHAPE, "grade scores min_grade attempt max_retries weak axes")


class AskingCameraman:
    """Judges attempts by the studio's rule (`studio_rules.studio_verdict`): the grade against the minimum, the
    attempt against the retry limit. The model names what failed and how to fix it; its reasons are kept
    beside the grader's own when they are reasons, and a review that never validates is the rule alone."""

    def __init__(self, asker: Asker) -> None:
        self._asker = asker

    def review(self, brief: ReviewBrief) -> Verdict:
        rule = studio_rules.studio_verdict(brief)
        try:
            reply = self._asker.ask(
                Question(
                    task="review",
                    payload={
                        "grade": brief.grade,
                        "scores": brief.scores,
                        "min_grade": brief.min_grade,
                        "attempt": brief.attempt,
                        "max_retries": brief.max_retries,
                    },
                    shape=REVIEW_SHAPE,
                    reply=VerdictReply,
                    video_id=brief.video_id,
                    rules=REVIEW_RULES,
                    max_tokens=REVIEW_TOKENS,
                )
            )
        except NoValidReply as error:
            log.warning("cameraman: no valid review of video %s; the studio's rule decides: %s", brief.video_id, error)
            return replace(rule, note=f"the model's replies never validated: {error}")
        if reply.action != rule.action:
            log.info(
                "cameraman said %s for grade %s (attempt %d of %d); the rule says %s",
                reply.action,
                brief.grade,
                brief.attempt,
                brief.max_retries,
                rule.action,
            )
        if rule.action == "accept":
            return replace(rule, source="model")
        reasons = list(dict.fromkeys(rule.failure_reasons + checks.sensible(reply.failure_reasons, REVIEW_WORDS)))
        strategy = "; ".join(
            s for s in dict.fromkeys([rule.strategy, *checks.sensible([reply.strategy], REVIEW_WORDS)]) if s
        )
        return replace(
            rule, failure_reasons=reasons, strategy=strategy if rule.action == "refine" else "", source="model"
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
                max_tokens=CONSOLIDATE_TOKENS,
                rules="summary: what was produced since the last consolidation, in one or two sentences "
                "(conversations: what the crew's conversations answered meanwhile); "
                "learnings: at most three reusable lessons about what made prompts succeed or fail (may be empty).",
            )
        )
        return Consolidation(summary=reply.summary, learnings=reply.learnings)
