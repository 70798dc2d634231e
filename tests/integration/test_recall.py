"""Recall memory on a real PostgreSQL: buffers, eviction, autoclear and the maintenance v3 policy."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa

from mas.config import Settings
from mas.db import session_scope
from mas.memory import recall
from mas.models import AgentBuffer, AgentMessage


def _fill(settings: Settings, agent: str, n: int, *, text: str = "filler message number {i}. More.") -> None:
    """Put `n` live messages in the agent's buffer with one INSERT, as a long-running agent would have."""
    if n == 0:
        return
    rows = [{"agent": agent, "role": "user", "content": text.format(i=i), "in_context": True} for i in range(n)]
    with session_scope(settings) as session:
        session.execute(sa.insert(AgentMessage).values(rows))


def _rows(settings: Settings, agent: str) -> list[tuple[str, bool]]:
    with session_scope(settings) as session:
        return [tuple(r) for r in session.execute(
            sa.select(AgentMessage.content, AgentMessage.in_context)
            .where(AgentMessage.agent == agent)
            .order_by(AgentMessage.id)
        )]


def _buffer(settings: Settings, agent: str) -> AgentBuffer:
    with session_scope(settings) as session:
        return session.get(AgentBuffer, agent)


def _broken(summary: str, evicted: Sequence[recall.Message]) -> str:  # noqa: ARG001  # a summarizer's signature
    """A summarizer whose model is down."""
    raise ConnectionError("summarizer unreachable")


def test_unknown_agent_is_refused_and_nothing_is_written(clean):
    for call in (
        lambda: recall.append(clean, "editor", role="user", content="hi"),
        lambda: recall.context(clean, "editor"),
        lambda: recall.search(clean, "hi", agent="editor"),
        lambda: recall.begin_run(clean, "editor"),
        lambda: recall.count(clean, "editor"),
        lambda: recall.summarize(clean, "editor"),
        lambda: recall.reset(clean, "editor"),
    ):
        with pytest.raises(ValueError, match="unknown agent"):
            call()
    with session_scope(clean) as session:
        assert session.scalar(sa.select(sa.func.count()).select_from(AgentMessage)) == 0
        assert session.scalar(sa.select(sa.func.count()).select_from(AgentBuffer)) == 0


def test_append_and_context_in_order(clean):
    ids = [recall.append(clean, "writer", role=role, content=f"line {i}")
           for i, role in enumerate(["user", "assistant", "user"])]
    assert ids == sorted(ids)
    ctx = recall.context(clean, "writer")
    assert ctx.summary == ""
    assert [(m.id, m.role, m.content) for m in ctx.messages] == [
        (ids[0], "user", "line 0"), (ids[1], "assistant", "line 1"), (ids[2], "user", "line 2")
    ]
    assert all(m.in_context and m.agent == "writer" for m in ctx.messages)
    assert recall.count(clean, "writer") == 3
    assert recall.count(clean, "director") == 0
    assert recall.context(clean, "director") == recall.Context(summary="", messages=())


def test_append_evicts_oldest_into_summary_a_chunk_at_a_time(clean):
    """Past the bound the oldest leave together with a quarter of the bound more, so the buffer's start (the
    prompt prefix an endpoint caches) stays put for that many calls."""
    settings = clean.model_copy(update={"context_max_messages": 8})  # a chunk of 2
    starts = []
    for i in range(12):
        recall.append(settings, "director", role="user", content=f"Shot {i} is a wide pan. Then more detail.")
        starts.append(recall.context(settings, "director").messages[0].content.split(" is")[0])
    # the 9th message evicts 1 + 2 (6 live), the 12th evicts 3 more (6 live)
    assert starts == ["Shot 0"] * 8 + ["Shot 3"] * 3 + ["Shot 6"]
    ctx = recall.context(settings, "director")
    assert [m.content.split(" is")[0] for m in ctx.messages] == [f"Shot {i}" for i in range(6, 12)]
    assert ctx.summary == "\n".join(f"user: Shot {i} is a wide pan." for i in range(6))
    assert recall.count(settings, "director") == 6
    assert [live for _, live in _rows(settings, "director")] == [False] * 6 + [True] * 6


def test_summary_stays_bounded(clean):
    settings = clean.model_copy(update={"context_max_messages": 2})
    for i in range(120):
        recall.append(settings, "writer", role="assistant", content=f"Draft {i}: " + "word " * 100)
    summary = recall.context(settings, "writer").summary
    assert len(summary) <= recall.SUMMARY_MAX_CHARS
    assert all(len(line) <= len("assistant: ") + recall.DIGEST_LINE_MAX_CHARS for line in summary.splitlines())
    assert summary.splitlines()[-1].startswith("assistant: Draft 117:")  # newest evicted kept, oldest dropped
    assert "Draft 0:" not in summary


def test_append_evicts_even_when_summarizer_fails(clean):
    settings = clean.model_copy(update={"context_max_messages": 2})
    for i in range(4):
        recall.append(settings, "cameraman", role="user", content=f"m{i}", summarizer=_broken)
    assert recall.count(settings, "cameraman") == 2
    assert recall.context(settings, "cameraman").summary == ""
    assert _buffer(settings, "cameraman").failed_summaries == 2
    assert len(recall.search(settings, "m", agent="cameraman")) == 4


def test_role_is_checked(clean):
    with pytest.raises(ValueError, match="role"):
        recall.append(clean, "writer", role="", content="x")
    with pytest.raises(ValueError, match="role"):
        recall.append(clean, "writer", role="r" * 17, content="x")


def test_search_finds_in_and_out_of_context_newest_first(clean):
    settings = clean.model_copy(update={"context_max_messages": 2})
    recall.append(settings, "director", role="user", content="The RED balloon floats")
    recall.append(settings, "director", role="user", content="a blue sky")
    recall.append(settings, "writer", role="assistant", content="red balloon over the sea")
    recall.append(settings, "director", role="assistant", content="Red balloon pops")
    recall.append(settings, "director", role="user", content="100% of_it")

    found = recall.search(settings, "red BALLOON")
    assert [m.content for m in found] == ["Red balloon pops", "red balloon over the sea", "The RED balloon floats"]
    assert found[-1].in_context is False  # evicted, still in recall
    assert [m.content for m in recall.search(settings, "balloon", agent="director", limit=1)] == ["Red balloon pops"]
    assert [m.content for m in recall.search(settings, "%")] == ["100% of_it"]  # LIKE wildcards are literal
    assert recall.search(settings, "o_i") == []
    assert len(recall.search(settings, "  ")) == 5
    with pytest.raises(ValueError, match="limit"):
        recall.search(settings, "red", limit=0)


def test_begin_run_clears_sleeptime_agents_only(clean):
    settings = clean.model_copy(update={"context_max_messages": 2})
    for agent in ("writer", "writer_sleeptime"):
        for i in range(3):
            recall.append(settings, agent, role="user", content=f"{agent} note {i}.")

    assert recall.begin_run(settings, "writer") == 0
    assert recall.count(settings, "writer") == 2
    assert recall.context(settings, "writer").summary == "user: writer note 0."

    assert recall.begin_run(settings, "writer_sleeptime") == 2
    assert recall.context(settings, "writer_sleeptime") == recall.Context(summary="", messages=())
    assert len(recall.search(settings, "note", agent="writer_sleeptime")) == 3  # still in recall
    assert recall.begin_run(settings, "director_sleeptime") == 0  # no buffer yet: nothing to clear


def test_summarize_keeps_the_newest(clean):
    _fill(clean, "director", 30)
    assert recall.summarize(clean, "director", keep=4) == 26
    ctx = recall.context(clean, "director")
    assert [m.content for m in ctx.messages] == [f"filler message number {i}. More." for i in range(26, 30)]
    assert ctx.summary.splitlines()[0] == "user: filler message number 0."
    assert len(ctx.summary.splitlines()) == 26
    assert recall.summarize(clean, "director", keep=4) == 0  # nothing more to fold


def test_summarize_failure_is_counted_and_success_clears_it(clean):
    _fill(clean, "writer", 20)
    for expected in (1, 2):
        with pytest.raises(recall.SummaryFailed, match="summarizer unreachable"):
            recall.summarize(clean, "writer", summarizer=_broken)
        assert _buffer(clean, "writer").failed_summaries == expected
    assert recall.count(clean, "writer") == 20  # nothing left the buffer on failure
    recall.summarize(clean, "writer")
    assert _buffer(clean, "writer").failed_summaries == 0
    assert recall.count(clean, "writer") == recall.KEEP_AFTER_SUMMARY


def test_reset_clears_buffer_and_failures_but_keeps_summary(clean):
    _fill(clean, "cameraman", 15)
    recall.summarize(clean, "cameraman", keep=5)
    with pytest.raises(recall.SummaryFailed):
        recall.summarize(clean, "cameraman", keep=0, summarizer=_broken)
    summary = recall.context(clean, "cameraman").summary
    assert summary and _buffer(clean, "cameraman").failed_summaries == 1

    assert recall.reset(clean, "cameraman") == 5
    assert recall.count(clean, "cameraman") == 0
    assert _buffer(clean, "cameraman").failed_summaries == 0
    assert recall.context(clean, "cameraman").summary == summary
    assert len(_rows(clean, "cameraman")) == 15


def test_maintain_thresholds(clean, caplog):
    sizes = {"director": 0, "writer": 299, "cameraman": 300,
             "director_sleeptime": 500, "writer_sleeptime": 600, "cameraman_sleeptime": 499}
    for agent, n in sizes.items():
        _fill(clean, agent, n)
    with caplog.at_level(logging.DEBUG, logger="mas.memory.recall"):
        actions = {a.agent: a for a in recall.maintain(clean)}

    assert list(actions) == list(recall.AGENTS)
    got = {a: (r.count_before, r.level, r.action, r.count_after) for a, r in actions.items()}
    assert got == {
        "director": (0, "ok", "ok", 0),
        "writer": (299, "ok", "ok", 299),
        "cameraman": (300, "warn", "summarize", recall.KEEP_AFTER_SUMMARY),
        "director_sleeptime": (500, "critical", "reset", 0),
        "writer_sleeptime": (600, "emergency", "reset", 0),
        "cameraman_sleeptime": (499, "warn", "summarize", recall.KEEP_AFTER_SUMMARY),
    }
    assert "300 messages >= warn threshold 300" in actions["cameraman"].reason
    assert actions["writer_sleeptime"].reason == "600 messages >= emergency threshold 600"
    assert recall.context(clean, "cameraman").summary  # what left is summarized
    assert "maintain writer_sleeptime: reset at level emergency, 600 -> 0 messages" in caplog.text
    with pytest.raises(AttributeError):
        actions["director"].action = "reset"  # records are frozen


def test_maintain_resets_after_two_failed_summaries(clean):
    _fill(clean, "director", 300)
    first = recall.maintain(clean, summarizer=_broken)[0]
    assert (first.action, first.level, first.count_after) == ("summarize", "warn", 300)
    assert "1 of 2 failures" in first.reason
    assert _buffer(clean, "director").failed_summaries == 1

    second = recall.maintain(clean, summarizer=_broken)[0]
    assert (second.action, second.count_before, second.count_after) == ("reset", 300, 0)
    assert "2 failures reached 2" in second.reason
    assert _buffer(clean, "director").failed_summaries == 0


def test_maintain_resets_when_failures_already_at_max(clean):
    _fill(clean, "writer", 5)
    for _ in range(2):
        with pytest.raises(recall.SummaryFailed):
            recall.summarize(clean, "writer", keep=0, summarizer=_broken)
    _fill(clean, "writer", 295)
    action = recall.maintain(clean)[1]
    assert (action.agent, action.action, action.count_after) == ("writer", "reset", 0)
    assert action.reason == "2 failed summaries >= 2"


def test_concurrent_appends_lose_nothing(clean):
    settings = clean.model_copy(update={"context_max_messages": 7})
    threads, per_thread = 8, 25

    def worker(t: int) -> list[int]:
        return [recall.append(settings, "director", role="user", content=f"t{t} m{i}.") for i in range(per_thread)]

    with ThreadPoolExecutor(threads) as pool:
        ids = [i for batch in pool.map(worker, range(threads)) for i in batch]

    assert len(set(ids)) == threads * per_thread
    rows = _rows(settings, "director")
    assert sorted(c for c, _ in rows) == sorted(f"t{t} m{i}." for t in range(threads) for i in range(per_thread))
    live = sum(in_context for _, in_context in rows)
    assert 7 - 7 // recall.EVICT_CHUNK_DIVISOR <= live <= 7
    assert [in_context for _, in_context in rows] == [False] * (len(rows) - live) + [True] * live
    summary = recall.context(settings, "director").summary.splitlines()
    assert summary == [f"user: {c}" for c, _ in rows[:-live]]  # every evicted message folded exactly once
