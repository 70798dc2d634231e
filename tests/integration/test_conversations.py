"""A role's conversations and the endpoint's capacity: calls of one role in parallel, each conversation one
call at a time, never mixing; no more calls at once than the endpoint takes; the consolidator reads them all.

The endpoint is the fault-injecting stand-in of `tests/llm_faults.py` (it is not a model): it holds every
request until the test opens its gate and counts the requests in flight, so what runs at once is seen at the
endpoint itself. Waits are on events (requests arriving, a backend waiting on a lock), never on a sleep.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import sqlalchemy as sa

from mas import db, names
from mas.agents.llm import LLMAgent
from mas.agents.protocol import Question
from mas.agents.replies import DraftReply
from mas.config import Settings
from mas.domain.identity import STUDIO
from mas.memory import recall
from mas.models import AgentCall
from tests.llm_faults import FaultyLLM


def _settings(settings: Settings, url: str, **extra) -> Settings:
    return settings.model_copy(update={"agent_backend": "llm", "llm_url": url, "llm_structured": "prompt", **extra})


def _echo(body: dict) -> str:
    """A reply that names the concept the request asked about (so a mixed-up conversation shows)."""
    concept = re.search(r'"concept": "([^"]+)"', body["messages"][-1]["content"]).group(1)
    return json.dumps({"prompt": f"a prompt about {concept}", "negative_prompt": ""})


def _question(concept: str, video_id: int | None = None) -> Question:
    return Question(
        task="write", payload={"brief": {"concept": concept}}, shape='{"prompt": str}', reply=DraftReply,
        video_id=video_id,
    )


def _waiting_on_locks(settings: Settings) -> int:
    """Database sessions waiting for an advisory lock right now (a call waiting for a conversation or a slot)."""
    with db.ready_engine(settings).connect() as conn:
        return conn.scalar(sa.text(
            "select count(*) from pg_stat_activity where wait_event_type = 'Lock' and wait_event = 'advisory'"
        ))


def _wait_for(condition, *, timeout: float = 60, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_calls_of_one_role_run_at_once_each_in_its_own_conversation(clean):
    gate = threading.Event()
    concepts = ["a heron", "a kite", "a lighthouse"]
    with FaultyLLM([_echo], gate=gate) as llm:
        settings = _settings(clean, llm.url, agent_conversations=3, llm_max_in_flight=8)
        with ThreadPoolExecutor(3) as pool:
            calls = [pool.submit(LLMAgent(settings, STUDIO, "writer").ask, _question(c)) for c in concepts]
            llm.wait_in_flight(3)  # all three at the endpoint at once: no role lock in the way
            gate.set()
            replies = [call.result(timeout=60) for call in calls]
    assert [r.prompt for r in replies] == [f"a prompt about {c}" for c in concepts]
    seen = {}
    for talk in recall.conversations("writer", 3):
        messages = recall.context(settings, talk).messages
        assert [m.role for m in messages] == ["user", "assistant"], talk  # one exchange each, never mixed
        concept = re.search(r'"concept": "([^"]+)"', messages[0].content).group(1)
        assert messages[1].content == json.dumps({"prompt": f"a prompt about {concept}", "negative_prompt": ""})
        seen[talk] = concept
    assert sorted(seen.values()) == sorted(concepts)


def test_calls_to_one_conversation_stay_one_at_a_time(clean):
    gate = threading.Event()
    with FaultyLLM([_echo], gate=gate) as llm:
        settings = _settings(clean, llm.url, agent_conversations=1, llm_max_in_flight=8)
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(LLMAgent(settings, STUDIO, "writer").ask, _question("a heron"))
            llm.wait_in_flight(1)
            second = pool.submit(LLMAgent(settings, STUDIO, "writer").ask, _question("a kite"))
            _wait_for(lambda: _waiting_on_locks(settings) >= 1, what="the second call to wait for the conversation")
            assert llm.in_flight == 1  # the second call waits for the conversation, not at the endpoint
            gate.set()
            first.result(timeout=60), second.result(timeout=60)
    assert llm.most_in_flight == 1
    messages = recall.context(settings, "writer").messages
    assert [m.role for m in messages] == ["user", "assistant"] * 2


def test_a_video_keeps_to_its_conversation_while_that_one_is_free(clean):
    with FaultyLLM([_echo]) as llm:
        settings = _settings(clean, llm.url, agent_conversations=4)
        for _ in range(2):
            LLMAgent(settings, STUDIO, "writer").ask(_question("a heron", video_id=6))
    assert recall.count(settings, recall.conversation("writer", 6 % 4)) == 4
    with db.session_scope(settings) as session:
        calls = session.execute(sa.select(AgentCall.agent, AgentCall.video_id, AgentCall.valid)).all()
    assert calls == [("writer.2", 6, True)] * 2  # what each call cost is kept against its video


def test_what_the_calls_cost_is_told_per_video_of_a_batch(clean):
    from mas.domain.requests import ProductionRequest
    from mas.models import Video
    from mas.pipeline.production import new_batch
    from mas.reports.queries import agent_usage

    request = ProductionRequest(text="Create 2 videos of owls", kind="batch", count=2, theme="owls")
    with db.session_scope(clean) as session:
        batch = new_batch(session, request, priority="normal", user="default")
        videos = [Video(batch_id=batch.id, position=i, concept=f"owl {i}") for i in (1, 2)]
        session.add_all(videos)
        session.flush()
        batch_id, ids = batch.id, [v.id for v in videos]
    with FaultyLLM([_echo]) as llm:
        settings = _settings(clean, llm.url)
        LLMAgent(settings, STUDIO, "director").ask(dataclasses.replace(_question("owls"), batch_id=batch_id))
        for video_id in ids:
            LLMAgent(settings, STUDIO, "writer").ask(_question("an owl", video_id=video_id))
        LLMAgent(settings, STUDIO, "writer").ask(_question("not of this batch", video_id=ids[-1] + 100))
    usage = agent_usage(settings, batch_id)
    assert (usage.calls, usage.invalid, usage.videos) == (3, 0, 2)
    # the stand-in reports 10 prompt tokens (4 of them cached) and 5 completion tokens per request
    assert (usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens) == (30, 12, 15)
    assert usage.per_video(usage.prompt_tokens) == 15


def test_the_endpoint_cap_holds_under_a_burst(clean):
    gate = threading.Event()
    with FaultyLLM([_echo], gate=gate) as llm:
        settings = _settings(clean, llm.url, agent_conversations=8, llm_max_in_flight=2)
        roles = ["writer", "writer", "cameraman", "director"]  # a call holds 2 connections; the pool has 10
        with ThreadPoolExecutor(len(roles)) as pool:
            calls = [pool.submit(LLMAgent(settings, STUDIO, r).ask, _question(f"thing {i}")) for i, r in enumerate(roles)]
            llm.wait_in_flight(2)
            _wait_for(lambda: _waiting_on_locks(settings) >= 1, what="a call to wait for an endpoint slot")
            assert llm.in_flight == 2
            gate.set()
            for call in calls:
                call.result(timeout=60)
    assert llm.most_in_flight == 2 and len(llm.requests) == len(roles)


def test_the_consolidator_reads_every_conversation_of_its_role(clean):
    from mas.runtime.app import Studio

    recall.append(clean, "writer", role="assistant", content="a heron in mist, slow dolly-in")
    recall.append(clean, "writer.2", role="assistant", content="a kite over dunes, golden hour")
    recall.append(clean, "cameraman.1", role="assistant", content="refine: the motion is jittery")
    app = Studio(clean, set_as_current=False)
    app.loader.import_default_modules()
    app.tasks[names.CONSOLIDATE].apply().get(timeout=60)
    read = [m.content for m in recall.context(clean, "director_sleeptime").messages if m.role == "user"]
    assert "writer answered: a heron in mist, slow dolly-in" in read
    assert "writer.2 answered: a kite over dunes, golden hour" in read
    assert "cameraman.1 answered: refine: the motion is jittery" in read


def test_the_consolidator_reads_the_newest_replies_that_fit_and_counts_the_rest(clean):
    """A night's replies would overflow a model's context: the newest that fit half the budget, and a count."""
    from mas.runtime.app import Studio

    settings = clean.changed(llm_context_chars=2000)
    recall.append(settings, "cameraman", role="assistant", content="refine: the oldest verdict")
    for i in range(12):
        recall.append(settings, "writer", role="assistant", content=f"prompt {i:02d}: " + "a heron in mist " * 12)
    recall.append(settings, "cameraman", role="assistant", content="accept: the newest verdict")
    app = Studio(settings, set_as_current=False)
    app.loader.import_default_modules()
    app.tasks[names.CONSOLIDATE].apply().get(timeout=60)
    read = [m.content for m in recall.context(settings, "director_sleeptime").messages if m.role == "user"]
    listed = [line for line in read if line.startswith("writer answered: prompt")]
    assert listed and listed[-1].startswith("writer answered: prompt 11") and len(listed) < 12
    assert sum(map(len, listed)) <= 1000
    assert f"({13 - len(listed)} earlier replies not listed)" in read  # the oldest verdict among them
    # newest by time over every role, not by role: the newest verdict is read, the oldest is not
    assert "cameraman answered: accept: the newest verdict" in read
    assert "cameraman answered: refine: the oldest verdict" not in read
