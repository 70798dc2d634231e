"""Director, Writer, Cameraman and Consolidator played by agents on the Letta server.

They implement the role interfaces of `mas.agents.roles`, like the offline backend, so tasks do not know
which backend plays. A role call brings the server's core blocks up to date with the studio's, sends one
message in the task protocol (`prompts`) and reads one JSON object back (`replies`). Calls to one agent
are serialized by an advisory lock: Letta loses in-context messages when one agent gets two at once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

from mas import db, locks, names
from mas.agents.letta.blocks import push_studio_blocks
from mas.agents.letta.client import client, translated
from mas.agents.letta.errors import LettaNotFound
from mas.agents.letta.prompts import task_message
from mas.agents.letta.provisioning import crew
from mas.agents.letta.replies import ReplyFields, reply_object
from mas.agents.roles import (
    Agents,
    Consolidation,
    Draft,
    Plan,
    PlannedVideo,
    StylePreferences,
    Verdict,
    WriterBrief,
    draft_seed,
)
from mas.config import Settings
from mas.requests import ProductionRequest

log = logging.getLogger(__name__)

MESSAGE_TIMEOUT_S = 300.0
"""Longest a role call may take: an LLM turn, tool steps included."""

AGENT_LOCK_TIMEOUT_S = 600
"""Longest a call waits for another call to the same agent to finish before giving up (retryable)."""


@contextmanager
def agent_turn(settings: Settings, name: str) -> Iterator[None]:
    """Hold agent `name` for one call or maintenance step: nobody else talks to it meanwhile."""
    with locks.held(db.ready_engine(settings), names.agent_lock(name), timeout_s=AGENT_LOCK_TIMEOUT_S):
        yield


class RoleAgent:
    """One Letta agent a role talks to: sends a task, returns the JSON object of its reply.

    `serialize=False` skips the advisory locks, for callers with no studio database to hold them in.
    """

    def __init__(self, settings: Settings, role: str, *, serialize: bool = True) -> None:
        self.settings, self.role, self.serialize = settings, role, serialize

    def ask(self, task: str, payload: dict[str, Any], reply: str, rules: str = "") -> ReplyFields:
        push_studio_blocks(self.settings, lock=self.serialize)
        response = self._send(task_message(task, payload, reply, rules), task)
        return ReplyFields(reply_object(response, agent=self.role, task=task), agent=self.role, task=task)

    def _send(self, text: str, task: str):
        api = client(self.settings).with_options(timeout=MESSAGE_TIMEOUT_S, max_retries=0)
        agent_id = crew(self.settings).agents[self.role].id
        try:
            return self._message(api, agent_id, text, task)
        except LettaNotFound:
            log.warning("Letta agent %s (%s) vanished; looking it up again", self.role, agent_id)
        return self._message(api, crew(self.settings, refresh=True).agents[self.role].id, text, task)

    def _message(self, api, agent_id: str, text: str, task: str):
        with self._exclusive(), translated(f"{self.role} {task}"):
            return api.agents.messages.create(agent_id, messages=[{"role": "user", "content": text}])

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        if not self.serialize:
            yield
            return
        with agent_turn(self.settings, self.role):
            yield


class LettaDirector:
    """Plans batches, series and A/B tests, and reads style feedback, through the `director` agent."""

    def __init__(self, settings: Settings, *, serialize: bool = True) -> None:
        self._agent = RoleAgent(settings, "director", serialize=serialize)

    def plan(self, request: ProductionRequest, *, episodes_done: int = 0) -> Plan:
        payload = {"request": asdict(request), "episodes_done": episodes_done}
        rules = (
            f"exactly {request.count} videos, each a distinct concept on the theme. "
            + {
                "ab": "kind ab: variations of one concept, labels A, B, C... in order, each with a distinct "
                "camera/visual approach.",
                "series": f"kind series: episodes {episodes_done + 1} to {episodes_done + request.count} of "
                "one story; give the series style, consistency rules and recurring elements.",
            }.get(request.kind, "label null and approach empty.")
        )
        reply = self._agent.ask(
            "plan", payload,
            '{"videos": [{"concept": str, "label": str|null, "approach": str}], "series_style": str, '
            '"consistency_rules": [str], "series_elements": [str]}',
            rules,
        )
        videos = reply.value.get("videos")
        if not isinstance(videos, list) or not all(isinstance(v, dict) for v in videos):
            raise reply.problem("no list of videos", reply.value)
        if len(videos) != request.count:
            raise reply.problem(f"{len(videos)} videos where {request.count} were asked")
        planned = []
        for i, video in enumerate(videos):
            fields = ReplyFields(video, agent=reply.agent, task=reply.task)
            label = chr(ord("A") + i) if request.kind == "ab" else None  # the studio's labels, in order
            planned.append(PlannedVideo(
                concept=fields.text("concept", required=True), label=label, approach=fields.text("approach"),
            ))
        return Plan(
            videos=planned,
            series_style=reply.text("series_style"),
            consistency_rules=reply.texts("consistency_rules"),
            series_elements=reply.texts("series_elements"),
        )

    def read_style(self, feedback: str) -> StylePreferences:
        reply = self._agent.ask(
            "read_style", {"feedback": feedback},
            '{"colors": str, "moods": str, "themes": str, "pacing": str, "disliked": [str]}',
            "comma-separated words for colors, moods, themes and pacing, empty when not mentioned; disliked: "
            "the opposite aesthetics the feedback rules out.",
        )
        return StylePreferences(
            colors=reply.text("colors"), moods=reply.text("moods"), themes=reply.text("themes"),
            pacing=reply.text("pacing"), disliked=reply.texts("disliked"),
        )


class LettaWriter:
    """Writes each attempt's prompt through the `writer` agent; the seed is the studio's, not the model's."""

    def __init__(self, settings: Settings, *, serialize: bool = True) -> None:
        self._agent = RoleAgent(settings, "writer", serialize=serialize)

    def write(self, brief: WriterBrief) -> Draft:
        reply = self._agent.ask(
            "write", {"brief": asdict(brief)},
            '{"prompt": str, "negative_prompt": str}',
            "apply user_style and the series rules; prevent failure_patterns; on a retry fix "
            "previous_failures; never name anything in user_style.DISLIKED_ELEMENTS in the prompt; "
            "negative_prompt lists what to avoid.",
        )
        return Draft(
            prompt=reply.text("prompt", required=True), negative_prompt=reply.text("negative_prompt"),
            seed=draft_seed(brief),
        )


class LettaCameraman:
    """Judges attempts through the `cameraman` agent; never lets a refinement exceed the retry limit."""

    ACTIONS = ("accept", "refine", "fail")

    def __init__(self, settings: Settings, *, serialize: bool = True) -> None:
        self._agent = RoleAgent(settings, "cameraman", serialize=serialize)

    def review(self, *, grade: str, scores: dict[str, float], min_grade: str, attempt: int, max_retries: int) -> Verdict:
        payload = {"grade": grade, "scores": scores, "min_grade": min_grade, "attempt": attempt, "max_retries": max_retries}
        reply = self._agent.ask(
            "review", payload,
            '{"action": "accept"|"refine"|"fail", "failure_reasons": [str], "strategy": str}',
            "grades run A (best) to F; accept when grade is min_grade or better; otherwise name the weak "
            "axes as failure_reasons and refine with a strategy while attempt < max_retries, else fail.",
        )
        action = reply.text("action", required=True).lower()
        if action not in self.ACTIONS:
            raise reply.problem(f"action {action!r}, not one of {', '.join(self.ACTIONS)}")
        if action == "refine" and attempt >= max_retries:
            log.info("cameraman asked to refine attempt %d of %d; failing instead", attempt, max_retries)
            action = "fail"
        return Verdict(
            action=action,
            failure_reasons=reply.texts("failure_reasons"),
            strategy=reply.text("strategy") if action == "refine" else "",
        )


class LettaConsolidator:
    """Summarizes recent activity into learnings through the `director` agent.

    The director's sleeptime companion consolidates core memory on its own schedule; it answers with
    memory edits, never with a reply, so the synchronous consolidation the pipeline asks for goes to the
    director itself.
    """

    def __init__(self, settings: Settings, *, serialize: bool = True) -> None:
        self._agent = RoleAgent(settings, "director", serialize=serialize)

    def consolidate(self, *, activity: list[str]) -> Consolidation:
        reply = self._agent.ask(
            "consolidate", {"activity": activity},
            '{"summary": str, "learnings": [str]}',
            "summary: what was produced since the last consolidation, in one or two sentences; learnings: "
            "at most three reusable lessons about what made prompts succeed or fail (may be empty).",
        )
        return Consolidation(summary=reply.text("summary", required=True), learnings=reply.texts("learnings"))


def letta_agents(settings: Settings, *, serialize: bool = True) -> Agents:
    """The four roles played by agents on the Letta server (provisioned on first use)."""
    return Agents(
        director=LettaDirector(settings, serialize=serialize),
        writer=LettaWriter(settings, serialize=serialize),
        cameraman=LettaCameraman(settings, serialize=serialize),
        consolidator=LettaConsolidator(settings, serialize=serialize),
    )
