"""The studio's own rules: its plan, its prompt, its verdict, and the templates and fixes they use.

Deterministic, no model. They are the offline backend (`mas.agents.offline`) and what every model-backed role
falls back to (`mas.agents.asking`) when a model's reply never validates or says nothing usable. Same inputs,
same outputs.
"""

from __future__ import annotations

from collections.abc import Sequence

from mas import grades
from mas.agents import style_check
from mas.agents import vocabulary as V
from mas.agents.roles import (
    Draft,
    Plan,
    PlannedVideo,
    ReviewBrief,
    Verdict,
    WriterBrief,
    draft_seed,
)
from mas.agents.style import Style, words_of
from mas.domain.requests import ProductionRequest
from mas.gpu_rules import grading

ANGLES = [
    "at dawn, low golden mist",
    "in a thunderstorm",
    "close-up portrait",
    "wide establishing shot",
    "in an ancient ruin",
    "under moonlight",
    "in motion, tracking shot",
    "reflected in still water",
    "silhouetted against the sky",
    "in a hidden cave",
    "above the clouds",
    "in falling snow",
]
AB_APPROACHES = [
    "cinematic wide shot with a slow dolly-in",
    "intimate close-up with shallow depth of field",
    "dynamic handheld tracking shot",
    "symmetrical static composition, painterly light",
    "aerial drone sweep",
    "macro detail shot with rack focus",
]
STORY_BEATS = ["the call", "the trial", "the guardian awakens", "the storm", "the return", "the legacy"]

# Cameraman: what each weak axis means, and the Writer's fix for it.
FAILURE_REASONS = {
    "sharpness": "noisy, soft frames",
    "smoothness": "jittery, unstable motion",
    "palette": "colours off the requested palette",
}
FIXES = {
    "noisy, soft frames": "sharp focus, fine detail",
    "jittery, unstable motion": "steady camera, smooth slow motion",
    "colours off the requested palette": "dominant colours",
    **grading.FIXES,  # the DQA grader's failure phrases and their fixes
}
WEAK_BELOW = 0.7
"""A preview score under this is a weak axis."""


def studio_plan(request: ProductionRequest, *, episodes_done: int = 0) -> Plan:
    """The studio's plan: batches, series and A/B tests from the parsed request."""
    if request.kind == "ab":
        return Plan(
            videos=[
                PlannedVideo(
                    concept=request.theme, label=chr(ord("A") + i), approach=AB_APPROACHES[i % len(AB_APPROACHES)]
                )
                for i in range(request.count)
            ]
        )
    if request.kind == "series":
        name = request.series_name or request.theme
        videos = [
            PlannedVideo(
                concept=f"{name}, episode {n}: {STORY_BEATS[(n - 1) % len(STORY_BEATS)]}",
            )
            for n in range(episodes_done + 1, episodes_done + request.count + 1)
        ]
        return Plan(
            videos=videos,
            series_style=f"{name}: one recurring guardian, consistent palette and lighting across episodes",
            consistency_rules=[
                f"the same central character of {name} in every episode",
                "keep the colour palette and lighting of episode 1",
                "end each episode on the guardian's emblem",
            ],
            series_elements=["recurring guardian", "emblem", "ancient gate"],
        )
    return Plan(
        videos=[PlannedVideo(concept=f"{request.theme}, {ANGLES[i % len(ANGLES)]}") for i in range(request.count)]
    )


CRAFT_PHRASES = 2
"""Most phrases of how past successes were made that a prompt of the studio's takes."""


def craft_of(prompts: Sequence[str]) -> list[str]:
    """What made past successes work, never their subject: their phrases made only of camera, light and
    pacing words ("slow dolly-in", "golden hour light"); the subject phrase never is one."""
    found = []
    for prompt in prompts:
        for phrase in (p.strip() for p in prompt.split(",")):
            parts = [part for w in words_of(phrase) for part in w.split("-")]
            if parts and all(p in V.CRAFT or p in V.STOP_WORDS or p == "in" for p in parts):
                found.append(phrase)
    return list(dict.fromkeys(found))[:CRAFT_PHRASES]


def studio_prompt(brief: WriterBrief) -> Draft:
    """The studio's own prompt: the concept, the user's liked style in their words, the series' rules, the
    winning patterns, the fixes of known and of this attempt's failures and how past successes were made,
    with nothing the user ruled out."""
    series = brief.series
    style = Style.of(brief.user_style)
    parts = [brief.concept]
    if brief.approach:
        parts.append(brief.approach)
    if series.get("ACTIVE_SERIES"):
        parts.append(f"series style: {series['SERIES_STYLE']}")
        parts.extend(series.get("CONSISTENCY_RULES", [])[:2])
    parts.extend(style.phrases())
    parts.extend(brief.winning_patterns[-2:])
    # Known failure patterns are prevented up front; this attempt's failures are fixed on retry.
    parts.extend(fixes_for(brief.failure_patterns + brief.previous_failures))
    parts.extend(craft_of(brief.past_successes))
    kept = list(dict.fromkeys(p.strip() for p in parts if p.strip()))
    # the rest never under a "without" of the concept's
    prompt = style_check.repair(style_check.appended(kept[0] if kept else "", kept[1:]), style)
    return Draft(prompt=prompt, negative_prompt=studio_negative(brief), seed=draft_seed(brief), source="studio")


def studio_negative(brief: WriterBrief) -> str:
    """What the video model is told to avoid: what the user dislikes and the known failure patterns."""
    ruled_out = [i.words for i in Style.of(brief.user_style).ruled_out]
    return ", ".join(dict.fromkeys(ruled_out + brief.failure_patterns))


def fixes_for(reasons: Sequence[str]) -> list[str]:
    """The Writer's fix for each failure reason the studio knows, once each."""
    return list(dict.fromkeys(FIXES[r] for r in reasons if r in FIXES))


def weak_axes(scores: dict[str, float]) -> list[str]:
    """The grader's failure reasons, readable: the preview grader's weak axes, or DQA's (mas.gpu_rules.grading)."""
    preview = {k: v for k, v in scores.items() if k in FAILURE_REASONS}
    if not preview:
        return grading.failure_reasons(scores) or ["below the minimum grade on every axis"]
    weak = sorted((v, k) for k, v in preview.items() if v < WEAK_BELOW) or [min((v, k) for k, v in preview.items())]
    return [FAILURE_REASONS[k] for _, k in weak]


def studio_verdict(brief: ReviewBrief) -> Verdict:
    """The studio's rule: accept at or above the minimum grade; below it, refine with the grader's reasons
    and their fixes while attempts remain, else fail."""
    if grades.at_least(brief.grade, brief.min_grade):
        return Verdict(action="accept", failure_reasons=[], source="studio")
    reasons = weak_axes(brief.scores)
    if brief.attempt >= brief.max_retries:
        return Verdict(action="fail", failure_reasons=reasons, source="studio")
    return Verdict(action="refine", failure_reasons=reasons, strategy="; ".join(fixes_for(reasons)), source="studio")
