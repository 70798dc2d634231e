"""The agent roles as small interfaces, and the typed messages they exchange.

A backend (offline rules today, a Letta server later) implements these four roles; tasks only ever talk
to the interfaces, so a backend drops in through `mas.agents.backend(settings)`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from mas.agents.style import StyleItem
from mas.domain.plans import Plan, PlannedVideo
from mas.domain.requests import ProductionRequest

__all__ = ["Plan", "PlannedVideo"]  # the Director's plan, a domain value, named here with the roles that make it


@dataclass(frozen=True, kw_only=True)
class Reading:
    """What a user's feedback says, item by item, who read it (the model, its reading validated; or the
    studio's own reader when there is no model), and what was not understood. A model's reading that never
    validated is no reading: no items, the whole feedback not understood."""

    items: list[StyleItem]
    source: str = "studio"  # model | studio
    note: str = ""  # what the studio saw of the reading (the model's English it was checked against, ...)
    disagreements: list[str] = field(default_factory=list)  # where the studio's own reader reads the other way
    # the clauses, quoted as the user wrote them, that the reader did not understand: shown, never stored as items
    not_understood: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class WriterBrief:
    """Everything the Writer may use for one prompt."""

    concept: str
    attempt: int
    user_style: dict
    series: dict
    winning_patterns: list[str]
    failure_patterns: list[str]
    past_successes: list[str]  # archival: accepted prompts nearest the concept, nearest first
    past_failures: list[str] = field(default_factory=list)  # archival: rejected attempts nearest the concept
    previous_failures: list[str] = field(default_factory=list)  # this video's last attempt
    previous_prompt: str = ""  # this video's last attempt's prompt (a refinement must change it)
    approach: str = ""
    video_id: int | None = None  # which video it is for (bookkeeping; not shown to the model)


@dataclass(frozen=True, kw_only=True)
class Draft:
    prompt: str
    negative_prompt: str
    seed: int
    source: str = "model"  # model | repaired (the studio added or removed words) | studio (its own prompt)
    note: str = ""  # why the studio stepped in, when it did
    style_check: dict = field(default_factory=dict)  # the writer's check of a prompt only its model could read


@dataclass(frozen=True, kw_only=True)
class ReviewBrief:
    """What the Cameraman judges one attempt by: its grade against the minimum, the grader's scores, and the
    attempt against the retry limit."""

    grade: str
    scores: dict[str, float]
    min_grade: str
    attempt: int
    max_retries: int
    video_id: int | None = None  # which video it is for (bookkeeping; not shown to the model)


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """The Cameraman's decision on one attempt."""

    action: str  # "accept" | "refine" | "fail"
    failure_reasons: list[str]
    strategy: str = ""
    source: str = "model"  # model | studio (the studio's rule: the model's reply never validated)
    note: str = ""  # why the studio stepped in, when it did


@dataclass(frozen=True, kw_only=True)
class Consolidation:
    summary: str
    learnings: list[str]


class Director(Protocol):
    def plan(self, request: ProductionRequest, *, episodes_done: int = 0, batch_id: int | None = None) -> Plan: ...

    def read_style(self, feedback: str) -> Reading: ...


class Writer(Protocol):
    def write(self, brief: WriterBrief) -> Draft: ...


class Cameraman(Protocol):
    def review(self, brief: ReviewBrief) -> Verdict: ...


class Consolidator(Protocol):
    def consolidate(self, *, activity: list[str], conversations: Sequence[str] = ()) -> Consolidation:
        """`activity`: one line per video finished since the last run; `conversations`: what every
        conversation of every role answered meanwhile."""
        ...


@dataclass(frozen=True, kw_only=True)
class Agents:
    director: Director
    writer: Writer
    cameraman: Cameraman
    consolidator: Consolidator


def draft_seed(brief: WriterBrief) -> int:
    """The render seed of an attempt: reproducible from concept and attempt, whichever backend writes."""
    return int(hashlib.sha256(f"{brief.concept}|{brief.attempt}".encode()).hexdigest()[:8], 16) % 2**31
