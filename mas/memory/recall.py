"""Recall memory: every message each agent saw, and the live buffer it sees now.

Each agent (each conversation of a role: `conversation`) has a live buffer (its `agent_messages` rows with
`in_context` true) and a running summary (`agent_buffers.summary`). A message leaving the buffer is only
marked out of context: it stays in recall, where `search` finds it. Every write to one agent's buffer first
locks that agent's `agent_buffers` row, so concurrent writers (Celery processes, the maintenance beat)
serialize per agent and never lose or double-evict a message.

The seed system's finding shapes two rules here: history that piles up makes an agent drift from its
instructions, so the buffer is bounded (eviction on `append`, the maintenance v3 policy in `maintain`),
and sleeptime agents start every run from a clear buffer (`begin_run`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from mas.config import Settings
from mas.db import rows_changed, session_scope
from mas.errors import InvalidInput, RetryableError
from mas.memory import buffer_policy
from mas.memory.buffer_policy import Action, Decision
from mas.models import AgentBuffer, AgentMessage

log = logging.getLogger(__name__)

PRIMARY_AGENTS = ("director", "writer", "cameraman")
AGENTS = PRIMARY_AGENTS + tuple(f"{name}_sleeptime" for name in PRIMARY_AGENTS)

SUMMARY_MAX_CHARS = 4000  # cap on any stored summary, whichever summarizer wrote it
DIGEST_LINE_MAX_CHARS = 200  # one evicted message's line in the default digest
KEEP_AFTER_SUMMARY = 10  # live messages `summarize` leaves in context, so the agent keeps its thread
ROLE_MAX_CHARS = 16  # width of agent_messages.role
MAX_CONVERSATIONS = 64  # conversations one agent may hold (MAS_AGENT_CONVERSATIONS' bound)
EVICT_CHUNK_DIVISOR = 4  # an overflowing buffer evicts a quarter of its bound at once (see `append`)


@dataclass(frozen=True, kw_only=True)
class Message:
    """One recalled message, detached from the database session."""

    id: int
    agent: str
    role: str
    content: str
    in_context: bool
    created_at: datetime


@dataclass(frozen=True, kw_only=True)
class Context:
    """What an agent sees: the summary of what left its buffer, then its live messages, oldest first."""

    summary: str
    messages: tuple[Message, ...]


class SummaryFailed(RetryableError):
    """The summarizer raised; the agent's failure counter went up and its summary is unchanged."""


Summarizer = Callable[[str, Sequence[Message]], str]
"""(previous summary, messages leaving the buffer, oldest first) -> the new summary."""


def conversation(agent: str, index: int) -> str:
    """What recall calls conversation `index` of `agent`: the agent's own name for the first (its history
    from before conversations), `agent.index` for the others. Each has its own buffer and summary."""
    _check_agent(agent)
    if not 0 <= index < MAX_CONVERSATIONS:
        raise InvalidInput(f"conversation index must be 0 to {MAX_CONVERSATIONS - 1}, got {index}")
    return agent if index == 0 else f"{agent}.{index}"


def conversations(agent: str, count: int) -> tuple[str, ...]:
    """The first `count` conversations of `agent`."""
    return tuple(conversation(agent, index) for index in range(count))


def agent_of(name: str) -> str:
    """The agent a conversation belongs to."""
    return _check_agent(name).split(".", 1)[0]


def is_sleeptime(agent: str) -> bool:
    """True for the sleeptime companions, which must start each run from a clear buffer."""
    return agent_of(agent).endswith("_sleeptime")


def digest(summary: str, evicted: Sequence[Message]) -> str:
    """Default summarizer: the previous digest plus "role: first sentence" per evicted message.

    Deterministic and offline, so the offline backend and the tests need no model; only the newest
    lines that fit in SUMMARY_MAX_CHARS are kept, so the summary cannot grow without limit.
    """
    lines = summary.splitlines() + [line for m in evicted if (line := _digest_line(m))]
    kept: list[str] = []
    size = 0
    for line in reversed(lines):
        size += len(line) + 1
        if size > SUMMARY_MAX_CHARS + 1:
            break
        kept.append(line)
    return "\n".join(reversed(kept))


def append(settings: Settings, agent: str, *, role: str, content: str, summarizer: Summarizer = digest) -> int:
    """Add a message to the agent's live buffer and return its id.

    When the buffer then holds more than `context_max_messages`, the oldest messages leave context and
    are folded into the summary: a quarter of the bound at once, so the buffer's start (and with it the
    prompt prefix an endpoint caches) stays the same for many calls. If the summarizer fails they leave
    anyway (the bound on context is the point) with the summary unchanged and the failure counted; they
    remain in recall either way.
    """
    _check_agent(agent)
    if not 0 < len(role) <= ROLE_MAX_CHARS:
        raise InvalidInput(f"role must be 1 to {ROLE_MAX_CHARS} characters, got {role!r}")
    with session_scope(settings) as session:
        buffer = _lock(session, agent)
        message_id = session.execute(
            sa.insert(AgentMessage)
            .values(agent=agent, role=role, content=content, in_context=True)
            .returning(AgentMessage.id)
        ).scalar_one()
        overflow = _live_count(session, agent) - settings.memory.context_max_messages
        if overflow > 0:
            chunk = settings.memory.context_max_messages // EVICT_CHUNK_DIVISOR
            evicted = _oldest_live(session, agent, overflow + chunk)
            try:
                _fold(session, buffer, evicted, summarizer)
            except SummaryFailed:
                _evict(session, evicted)
    return message_id


def context(settings: Settings, agent: str) -> Context:
    """The running summary and the live messages in the order they were appended."""
    _check_agent(agent)
    with session_scope(settings) as session:
        summary = session.scalar(sa.select(AgentBuffer.summary).where(AgentBuffer.agent == agent))
        rows = session.scalars(
            sa.select(AgentMessage)
            .where(AgentMessage.agent == agent, AgentMessage.in_context)
            .order_by(AgentMessage.id)
        ).all()
        return Context(summary=summary or "", messages=tuple(_message(r) for r in rows))


def search(settings: Settings, query: str, *, agent: str | None = None, limit: int = 20) -> list[Message]:
    """Past messages, in and out of context, containing every word of `query`; newest first.

    Matching is plain case-insensitive substring matching (ILIKE '%word%' per word), not full-text or
    semantic search: recall is for finding exact past exchanges, archival memory does the semantic part.
    A blank query matches every message.
    """
    if agent is not None:
        _check_agent(agent)
    if limit < 1:
        raise InvalidInput(f"limit must be at least 1, got {limit}")
    statement = sa.select(AgentMessage).order_by(AgentMessage.id.desc()).limit(limit)
    if agent is not None:
        statement = statement.where(AgentMessage.agent == agent)
    for word in query.split():
        statement = statement.where(AgentMessage.content.ilike(f"%{_escape_like(word)}%", escape="\\"))
    with session_scope(settings) as session:
        return [_message(r) for r in session.scalars(statement)]


def begin_run(settings: Settings, agent: str) -> int:
    """Start a run: a sleeptime agent's buffer and summary are cleared ("message_buffer_autoclear").

    Accumulated history made the seed system's sleeptime agents ignore their instructions, so each of
    their runs starts clear; what they need to carry over lives in core and archival memory, and their
    past messages stay in recall. Other agents keep their buffer. Returns the messages cleared.
    """
    if not is_sleeptime(agent):
        return 0
    with session_scope(settings) as session:
        cleared = _clear(session, _lock(session, agent), keep_summary=False)
    log.info("autoclear %s: %d messages left context", agent, cleared)
    return cleared


@dataclass(frozen=True, kw_only=True)
class RecallStats:
    """What an agent's recall holds: every message it saw, the live part, and the time they span."""

    total: int
    live: int
    oldest: datetime | None
    newest: datetime | None


def stats(settings: Settings, agent: str) -> RecallStats:
    """Counts and time span of an agent's messages (what its context's memory statistics report)."""
    _check_agent(agent)
    with session_scope(settings) as session:
        total, oldest, newest = session.execute(
            sa.select(
                sa.func.count(), sa.func.min(AgentMessage.created_at), sa.func.max(AgentMessage.created_at)
            ).where(AgentMessage.agent == agent)
        ).one()
        return RecallStats(total=total, live=_live_count(session, agent), oldest=oldest, newest=newest)


def count(settings: Settings, agent: str) -> int:
    """Messages in the agent's live buffer."""
    _check_agent(agent)
    with session_scope(settings) as session:
        return _live_count(session, agent)


def summarize(
    settings: Settings, agent: str, *, summarizer: Summarizer = digest, keep: int = KEEP_AFTER_SUMMARY
) -> int:
    """Fold all but the newest `keep` live messages into the summary; return how many left context.

    On success the failure counter is reset to 0. If the summarizer raises, nothing leaves the buffer,
    the counter goes up (committed, so `maintain` can reset after repeated failures) and SummaryFailed
    is raised.
    """
    _check_agent(agent)
    if keep < 0:
        raise InvalidInput(f"keep must not be negative, got {keep}")
    with session_scope(settings) as session:
        try:
            return _summarize_locked(session, _lock(session, agent), summarizer, keep)
        except SummaryFailed as exc:
            failure = exc  # raised only after the commit, which keeps the counted failure
    raise failure


def reset(settings: Settings, agent: str) -> int:
    """Empty the live buffer and the failure counter; return how many messages left context.

    The summary is kept: it is already bounded, so it cannot be what overflowed, and it is the agent's
    only view of what the reset removes. (Sleeptime agents lose it too, at `begin_run`.)
    """
    _check_agent(agent)
    with session_scope(settings) as session:
        return _clear(session, _lock(session, agent), keep_summary=True)


def recent(settings: Settings, agent: str, *, since: datetime | None, limit: int) -> list[Message]:
    """The newest messages of every conversation of `agent` written after `since` (None: ever), newest
    first: what the sleeptime consolidator reads of a role."""
    base = agent_of(agent)
    statement = (
        sa.select(AgentMessage)
        .where(sa.or_(AgentMessage.agent == base, AgentMessage.agent.like(f"{_escape_like(base)}.%", escape="\\")))
        .order_by(AgentMessage.id.desc())
        .limit(limit)
    )
    if since is not None:
        statement = statement.where(AgentMessage.created_at > since)
    with session_scope(settings) as session:
        return [_message(r) for r in session.scalars(statement)]


def known(settings: Settings) -> list[str]:
    """Every agent, then every further conversation that has a buffer, in name order."""
    with session_scope(settings) as session:
        names = set(session.scalars(sa.select(AgentBuffer.agent)))
    return [*AGENTS, *sorted(n for n in names - set(AGENTS) if _is_conversation(n))]


def maintain(settings: Settings, *, summarizer: Summarizer = digest) -> list[Action]:
    """Maintenance v3 (`mas.memory.buffer_policy`) on every agent's and conversation's buffer, each under
    its row lock; one record per buffer. (The beat job takes them one at a time through `mas.pipeline.rows`.)"""
    return [maintain_agent(settings, agent, summarizer=summarizer) for agent in known(settings)]


def maintain_agent(settings: Settings, agent: str, *, summarizer: Summarizer = digest) -> Action:
    """Maintenance v3 on one agent's or conversation's buffer, under its row lock."""
    with session_scope(settings) as session:
        buffer = _lock(session, agent)
        before = _live_count(session, agent)
        decision = buffer_policy.decide(settings, messages=before, failures=buffer.failed_summaries)
        done = _carry_out(settings, session, buffer, decision, summarizer)
        action = buffer_policy.record(agent, done, before=before, after=_live_count(session, agent))
    buffer_policy.log_action(log, action)
    return action


# --- internals: all take the session whose transaction holds the agent's row lock --------------------


def _carry_out(
    settings: Settings, session: Session, buffer: AgentBuffer, decision: Decision, summarizer: Summarizer
) -> Decision:
    """Apply the policy's decision to one locked buffer; the decision as finally carried out."""
    if decision.action == "reset":
        _clear(session, buffer, keep_summary=True)
    if decision.action != "summarize":
        return decision
    try:
        moved = _summarize_locked(session, buffer, summarizer, KEEP_AFTER_SUMMARY)
    except SummaryFailed as exc:  # `_fold` already counted the failure on the buffer
        follow_up = buffer_policy.after_failed_summary(
            settings, decision, failures=buffer.failed_summaries, problem=str(exc)
        )
        if follow_up.action == "reset":
            _clear(session, buffer, keep_summary=True)
        return follow_up
    return decision.noting(f"{moved} folded into summary")


def _summarize_locked(session: Session, buffer: AgentBuffer, summarizer: Summarizer, keep: int) -> int:
    excess = _live_count(session, buffer.agent) - keep
    if excess <= 0:
        return 0
    _fold(session, buffer, _oldest_live(session, buffer.agent, excess), summarizer)
    return excess


def _lock(session: Session, agent: str) -> AgentBuffer:
    """The agent's buffer row, created if missing, locked FOR UPDATE until the transaction ends."""
    session.execute(
        pg_insert(AgentBuffer)
        .values(agent=agent, summary="", failed_summaries=0, interactions=0)
        .on_conflict_do_nothing(index_elements=[AgentBuffer.agent])
    )
    return session.execute(
        sa.select(AgentBuffer)
        .where(AgentBuffer.agent == agent)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).scalar_one()


def _fold(session: Session, buffer: AgentBuffer, evicted: Sequence[Message], summarizer: Summarizer) -> None:
    """Summarize `evicted` into the buffer's summary, then take them out of context.

    Any exception of the summarizer (an LLM call may fail in many ways) becomes SummaryFailed, counted
    on the buffer, with nothing else changed; the caller decides whether the messages leave anyway.
    """
    try:
        summary = summarizer(buffer.summary, evicted)
    except Exception as exc:
        buffer.failed_summaries += 1
        buffer.updated_at = sa.func.now()
        log.warning("summarizing %d messages of %s failed: %r", len(evicted), buffer.agent, exc)
        raise SummaryFailed(f"summarizing {buffer.agent} failed: {exc!r}") from exc
    buffer.summary = summary[-SUMMARY_MAX_CHARS:]
    buffer.failed_summaries = 0
    buffer.updated_at = sa.func.now()
    _evict(session, evicted)


def _evict(session: Session, messages: Sequence[Message]) -> None:
    session.execute(
        sa.update(AgentMessage).where(AgentMessage.id.in_([m.id for m in messages])).values(in_context=False)
    )


def _clear(session: Session, buffer: AgentBuffer, *, keep_summary: bool) -> int:
    cleared = rows_changed(
        session,
        sa.update(AgentMessage)
        .where(AgentMessage.agent == buffer.agent, AgentMessage.in_context)
        .values(in_context=False),
    )
    if not keep_summary:
        buffer.summary = ""
    buffer.failed_summaries = 0
    buffer.updated_at = sa.func.now()
    return cleared


def _live_count(session: Session, agent: str) -> int:
    return session.scalar(sa.select(sa.func.count()).where(AgentMessage.agent == agent, AgentMessage.in_context)) or 0


def _oldest_live(session: Session, agent: str, limit: int) -> list[Message]:
    rows = session.scalars(
        sa.select(AgentMessage)
        .where(AgentMessage.agent == agent, AgentMessage.in_context)
        .order_by(AgentMessage.id)
        .limit(limit)
    ).all()
    return [_message(r) for r in rows]


def _message(row: AgentMessage) -> Message:
    return Message(
        id=row.id,
        agent=row.agent,
        role=row.role,
        content=row.content,
        in_context=row.in_context,
        created_at=row.created_at,
    )


def _digest_line(message: Message) -> str:
    text = " ".join(message.content.split())
    first = re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0]
    if len(first) > DIGEST_LINE_MAX_CHARS:
        first = first[: DIGEST_LINE_MAX_CHARS - 1] + "…"
    return f"{message.role}: {first}" if first else ""


def _escape_like(word: str) -> str:
    return word.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _is_conversation(name: str) -> bool:
    agent, _, index = name.partition(".")
    if agent not in AGENTS:
        return False
    if not index:
        return True
    return index.isdigit() and not index.startswith("0") and int(index) < MAX_CONVERSATIONS


def _check_agent(agent: str) -> str:
    if not _is_conversation(agent):
        raise InvalidInput(
            f"unknown agent {agent!r}; expected one of {', '.join(AGENTS)}, or a conversation of one (writer.2)"
        )
    return agent
