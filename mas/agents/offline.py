"""The offline agent backend: deterministic, rule-based, no model server.

It is exactly that: keyword rules and templates standing in for the Director, Writer, Cameraman and
sleeptime consolidator so the studio runs (and is tested) end to end without an LLM. Same inputs, same
outputs. The Letta backend replaces it behind the same interfaces.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Sequence

from mas import grading
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
from mas.palette import COLORS, COOL, WARM
from mas.pipeline.requests import ProductionRequest

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

MOODS = {
    "dark": "bright",
    "moody": "cheerful",
    "bright": "dark",
    "cheerful": "gloomy",
    "serene": "chaotic",
    "calm": "frantic",
    "mysterious": "plain",
    "epic": "mundane",
    "dreamy": "harsh",
    "gritty": "polished",
    "whimsical": "grim",
    "melancholic": "upbeat",
    "energetic": "sluggish",
    "gloomy": "cheerful",
}
PACING = {"slow": "fast cuts", "fast": "slow lingering shots", "dynamic": "static shots", "lingering": "fast cuts"}
THEMES = ["fantasy", "mythical", "sci-fi", "nature", "urban", "cosmic", "underwater", "gothic", "retro"]

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
STOP_WORDS = {"and", "or", "the", "a", "an", "with", "of", "tones", "aesthetics", "shots", "cuts", "lighting"}


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z][a-z-]*", text.lower())


class OfflineDirector:
    """Plans batches, series and A/B tests from the parsed request; reads style feedback by keywords."""

    def plan(self, request: ProductionRequest, *, episodes_done: int = 0, batch_id: int | None = None) -> Plan:
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

    def read_style(self, feedback: str) -> StylePreferences:
        words = _words(feedback)
        colors = [w for w in words if w in COLORS]
        moods = [w for w in words if w in MOODS]
        pacing = [w for w in words if w in PACING]
        themes = [w for w in words if w in THEMES]
        disliked = [f"{MOODS[m]} aesthetics" for m in moods] + [f"{PACING[p]}" for p in pacing]
        if colors and all(c in COOL for c in colors):
            disliked.append("warm orange and yellow tones")
        elif colors and all(c in WARM for c in colors):
            disliked.append("cold blue tones")
        return StylePreferences(
            colors=", ".join(colors),
            moods=", ".join(moods),
            themes=", ".join(themes),
            pacing=", ".join(pacing),
            disliked=disliked,
        )


class OfflineWriter:
    """Builds a prompt from the concept and memory; strips what the user dislikes."""

    def __init__(self, *, seconds: float = 0.0) -> None:
        self.seconds = seconds  # simulated thinking time (MAS_OFFLINE_AGENT_SECONDS)

    def write(self, brief: WriterBrief) -> Draft:
        time.sleep(self.seconds)
        style, series = brief.user_style, brief.series
        parts = [brief.concept]
        if brief.approach:
            parts.append(brief.approach)
        if series.get("ACTIVE_SERIES"):
            parts.append(f"series style: {series['SERIES_STYLE']}")
            parts.extend(series.get("CONSISTENCY_RULES", [])[:2])
        if style.get("COLOR_PREFERENCES"):
            parts.append(f"colour palette of {style['COLOR_PREFERENCES']}")
        if style.get("MOOD_PREFERENCES"):
            parts.append(f"{style['MOOD_PREFERENCES']} atmosphere and lighting")
        if style.get("PACING_PREFERENCES"):
            parts.append(f"{style['PACING_PREFERENCES']} pacing")
        parts.extend(brief.winning_patterns[-2:])
        # Known failure patterns are prevented up front; this attempt's failures are fixed on retry.
        fixes = [FIXES[f] for f in dict.fromkeys(brief.failure_patterns + brief.previous_failures) if f in FIXES]
        parts.extend(fixes)
        if brief.past_successes:
            parts.append(f"in the manner of a past success: {brief.past_successes[0][:80]}")
        prompt = ", ".join(p.strip() for p in parts if p.strip())
        banned = {w for d in style.get("DISLIKED_ELEMENTS", []) for w in _words(d)} - STOP_WORDS
        if banned:
            prompt = re.sub(r"\b(" + "|".join(map(re.escape, sorted(banned))) + r")\b\s*", "", prompt, flags=re.I)
            prompt = re.sub(r"\s+,", ",", re.sub(r",\s*,", ",", prompt)).strip(" ,")
        negative = ", ".join(dict.fromkeys(list(style.get("DISLIKED_ELEMENTS", [])) + brief.failure_patterns))
        return Draft(prompt=prompt, negative_prompt=negative, seed=draft_seed(brief))


class OfflineCameraman:
    """Accepts at or above the minimum grade; names the weak axes; refines until retries run out."""

    weak_below = 0.7

    def __init__(self, *, seconds: float = 0.0) -> None:
        self.seconds = seconds  # simulated thinking time (MAS_OFFLINE_AGENT_SECONDS)

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
        time.sleep(self.seconds)
        if grade_at_least(grade, min_grade):
            return Verdict(action="accept", failure_reasons=[])
        reasons = self.weak_axes(scores)
        if attempt >= max_retries:
            return Verdict(action="fail", failure_reasons=reasons)
        return Verdict(
            action="refine", failure_reasons=reasons, strategy="; ".join(FIXES[r] for r in reasons if r in FIXES)
        )

    def weak_axes(self, scores: dict[str, float]) -> list[str]:
        """Readable failure reasons: the preview grader's weak axes, or DQA's (mas.grading)."""
        preview = {k: v for k, v in scores.items() if k in FAILURE_REASONS}
        if not preview:
            return grading.failure_reasons(scores) or ["below the minimum grade on every axis"]
        weak = sorted((v, k) for k, v in preview.items() if v < self.weak_below) or [
            min((v, k) for k, v in preview.items())
        ]
        return [FAILURE_REASONS[k] for _, k in weak]


class OfflineConsolidator:
    """Summarizes recent activity and turns repeated outcomes into learnings."""

    def consolidate(self, *, activity: list[str], conversations: Sequence[str] = ()) -> Consolidation:
        if not activity:
            return Consolidation(summary="No production activity since the last consolidation.", learnings=[])
        outcomes = Counter(line.split(":", 1)[0] for line in activity)
        talks = Counter(line.split(" ", 1)[0] for line in conversations)
        summary = (
            f"{len(activity)} videos finished since the last consolidation "
            f"({', '.join(f'{n} {k}' for k, n in sorted(outcomes.items()))}); latest: {activity[-1][:160]}"
        )
        if talks:
            summary += f"; read {len(conversations)} replies of {len(talks)} conversations"
        fixes = Counter(
            fix for line in activity for fix in FIXES.values() if fix in line and line.startswith("accepted")
        )
        learnings = [f"accepted prompts often carried '{fix}' ({n} times)" for fix, n in fixes.most_common(3)]
        return Consolidation(summary=summary, learnings=learnings)
