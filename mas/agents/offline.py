"""The offline agent backend: the studio's own rules (`mas.agents.studio_rules`) playing every role, no model
server. The studio runs (and is tested) end to end with it; MAS_OFFLINE_AGENT_SECONDS adds thinking time.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence

from mas.agents import style_reader
from mas.agents.roles import Consolidation, Draft, Plan, Reading, ReviewBrief, Verdict, WriterBrief
from mas.agents.studio_rules import FIXES, studio_plan, studio_prompt, studio_verdict
from mas.domain.requests import ProductionRequest


class OfflineDirector:
    """Plans with the studio's plan; reads style feedback with the studio's reader."""

    def plan(self, request: ProductionRequest, *, episodes_done: int = 0, batch_id: int | None = None) -> Plan:  # noqa: ARG002
        return studio_plan(request, episodes_done=episodes_done)

    def read_style(self, feedback: str) -> Reading:
        understood = style_reader.understand(feedback)
        return Reading(
            items=understood.items, source="studio", not_understood=[u.text for u in understood.not_understood]
        )


class OfflineWriter:
    """Writes the studio's own prompt."""

    def __init__(self, *, seconds: float = 0.0) -> None:
        self.seconds = seconds  # simulated thinking time (MAS_OFFLINE_AGENT_SECONDS)

    def write(self, brief: WriterBrief) -> Draft:
        time.sleep(self.seconds)
        return studio_prompt(brief)


class OfflineCameraman:
    """Judges by the studio's rule."""

    def __init__(self, *, seconds: float = 0.0) -> None:
        self.seconds = seconds  # simulated thinking time (MAS_OFFLINE_AGENT_SECONDS)

    def review(self, brief: ReviewBrief) -> Verdict:
        time.sleep(self.seconds)
        return studio_verdict(brief)


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
