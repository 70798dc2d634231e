"""A Director's plan: the videos a batch will make and, for a series, what every episode keeps. Plain values,
with no I/O, so the engine stores a plan (`mas.pipeline.starting`) without knowing which agent made it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class PlannedVideo:
    concept: str
    label: str | None = None  # A/B variation label
    approach: str = ""  # A/B variation approach


@dataclass(frozen=True, kw_only=True)
class Plan:
    videos: list[PlannedVideo]
    series_style: str = ""
    consistency_rules: list[str] = field(default_factory=list)
    series_elements: list[str] = field(default_factory=list)
