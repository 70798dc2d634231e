"""Sleeptime: the Director's companion summarizes recent work into session_state and archival learnings.

Its task keeps the name it always had (`names.CONSOLIDATE`): beat's schedule and queued messages carry it.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from celery import shared_task

from mas import agents, names
from mas.db import session_scope
from mas.domain.identity import STUDIO
from mas.domain.states import TERMINAL
from mas.memory import blocks, recall
from mas.memory.archival import ArchivalMemory, NewPassage
from mas.models import Attempt, Video
from mas.pipeline import rows
from mas.runtime.app import AgentTask


@shared_task(name=names.CONSOLIDATE, bind=True, base=AgentTask)
def consolidate(self) -> dict:
    """Sleeptime: from a clear buffer, summarize recent work into session_state and archival learnings."""
    settings = self.app.settings
    crew = agents.backend(settings, STUDIO)  # the studio's own work: its shared blocks, no user's taste
    recall.begin_run(settings, "director_sleeptime")
    since = blocks.versioned(settings, STUDIO, "session_state").field_updated_at.get("LAST_SESSION_SUMMARY")
    with session_scope(settings) as session:
        stmt = sa.select(Video.id).where(Video.state.in_(list(TERMINAL))).order_by(Video.updated_at.desc())
        if since:
            stmt = stmt.where(Video.updated_at > sa.func.cast(since, sa.DateTime(timezone=True)))
        finished = session.scalars(stmt.limit(200)).all()[::-1]  # the newest 200, oldest first
    # one video at a time: one that cannot be read is marked and left out, the night's summary still written
    read = rows.each(settings, CONSOLIDATION_JOB, finished, lambda video_id: _activity(settings, video_id))
    activity = list(read.done.values())
    conversations = _conversations_since(settings, datetime.fromisoformat(since) if since else None)
    # the newest of each that fit half the context budget: a night's work must not overflow the model's context
    activity = _newest_within(activity, settings.llm.context_chars // 2, "finished videos")
    conversations = _newest_within(conversations, settings.llm.context_chars // 2, "replies")
    for line in activity + conversations:
        recall.append(settings, "director_sleeptime", role="user", content=line[:500])
    result = crew.consolidator.consolidate(activity=activity, conversations=conversations)
    recall.append(settings, "director_sleeptime", role="assistant", content=result.summary)
    blocks.update(
        settings,
        STUDIO,
        "session_state",
        {
            "LAST_ACTIVITY": blocks.now_iso(),
            "LAST_SESSION_SUMMARY": result.summary,
        },
        by="director_sleeptime",
    )
    if result.learnings:
        ArchivalMemory(settings).insert_many(
            [NewPassage(text=text, tags=["learning"], metadata={"source": "sleeptime"}) for text in result.learnings]
        )
    return {"summary": result.summary, "learnings": result.learnings}


CONSOLIDATION_JOB = "consolidation"
"""Sleeptime's reading of finished videos in `mas.pipeline.rows`."""


def _activity(settings, video_id: int) -> str:
    """One finished video as the consolidator reads it: its end, grade, attempts and last prompt."""
    with session_scope(settings) as session:
        v = session.get_one(Video, video_id)
        prompt = session.scalar(
            sa.select(Attempt.prompt).where(Attempt.video_id == v.id, Attempt.number == v.attempt_count)
        )
        return f"{v.state.value}: video {v.id} grade {v.grade} after {v.attempt_count} attempts; {prompt or ''}"


CONSOLIDATED_REPLIES = 20
"""Newest replies of each role (over all its conversations) that a consolidation reads."""


def _conversations_since(settings, since: datetime | None) -> list[str]:
    """What every conversation of every role answered since the last consolidation, oldest first over all
    roles (so that the newest of them are the last, whichever role wrote them)."""
    said = [
        m
        for role in recall.PRIMARY_AGENTS
        for m in recall.recent(settings, role, since=since, limit=2 * CONSOLIDATED_REPLIES)
        if m.role == "assistant"
    ]
    return [f"{m.agent} answered: {m.content[:300]}" for m in sorted(said, key=lambda m: m.id)]


def _newest_within(lines: list[str], budget: int, what: str) -> list[str]:
    """The newest lines (the list is oldest first) whose lengths add up to at most `budget`, oldest first, after
    a line that counts the older ones left out."""
    kept: list[str] = []
    for line in reversed(lines):
        if len(line) > budget:
            break
        budget -= len(line)
        kept.append(line)
    left_out = len(lines) - len(kept)
    return ([f"({left_out} earlier {what} not listed)"] if left_out else []) + kept[::-1]
