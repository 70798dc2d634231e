"""The llm agent backend against a REAL model (llama.cpp's server with SmolLM2-135M-Instruct), and its
failures against a fault-injecting stand-in (`tests/llm_faults.py`, which says what it is).

The real server is built by `scripts/llm-server-env.sh`; without it these tests skip with the reason
(MAS_TEST_REQUIRE_LLM=1, as CI sets, makes that a failure). Every prompt the studio sent to the model and
every reply it validated is written to `.test-artifacts/llm-exchanges.md` for a person to read.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from pydantic import SecretStr

from mas import db
from mas.agents import style_check
from mas.agents.llm import LLMAgent, LLMReplyError, LLMUnavailable, llm_agents
from mas.agents.llm.context import changing_memory, system_prompt
from mas.agents.meaning import StudioMeaning
from mas.agents.protocol import Question
from mas.agents.replies import DraftReply
from mas.agents.roles import ReviewBrief, WriterBrief, draft_seed
from mas.agents.style import Style
from mas.config import Settings
from mas.domain.identity import STUDIO
from mas.domain.requests import ProductionRequest
from mas.memory import blocks, recall
from mas.models import Attempt, Batch, BatchStatus, VideoState
from tests.llm_faults import HANG, FaultyLLM
from tests.llm_server import MODEL_NAME, LocalLLM, unavailable_reason
from tests.parts import need
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / ".test-artifacts"


def _need_server() -> None:
    need("LLM", unavailable_reason())


@pytest.fixture(scope="module")
def real_llm(tmp_path_factory):
    _need_server()
    with LocalLLM(tmp_path_factory.mktemp("llm")) as server:
        yield server


CONTEXT_CHARS = 2000
"""Recalled context per call: small, so 2 CPU cores answer a call in seconds (production keeps the default)."""


def _llm_settings(settings: Settings, url: str, **extra) -> Settings:
    return settings.model_copy(
        update={
            "agent_backend": "llm",
            "llm_url": url,
            "llm_model": MODEL_NAME,
            "llm_timeout_seconds": 300,
            "llm_context_chars": CONTEXT_CHARS,
            **extra,
        }
    )


def _env(url: str, **extra: str) -> dict[str, str]:
    return {
        "MAS_AGENT_BACKEND": "llm",
        "MAS_LLM_URL": url,
        "MAS_LLM_MODEL": MODEL_NAME,
        "MAS_PREVIEW_RENDER_SECONDS": "0",
        "MAS_LLM_CONTEXT_CHARS": str(CONTEXT_CHARS),
        **extra,
    }


def _record_exchanges(settings: Settings, title: str) -> None:
    """Append what each agent was sent and answered (its recall buffer and system prompt) to the artifact."""
    ARTIFACTS.mkdir(exist_ok=True)
    with (ARTIFACTS / "llm-exchanges.md").open("a") as out:
        out.write(f"\n# {title}\n")
        for agent in recall.known(settings):
            messages = recall.context(settings, agent).messages
            if not messages:
                continue
            out.write(f"\n## {agent}\n\n### system\n\n```\n{system_prompt(settings, STUDIO, agent)}\n```\n")
            for m in messages:
                out.write(f"\n### {m.role}\n\n```\n{m.content}\n```\n")


BRIEF = WriterBrief(
    concept="a red fox in fresh snow at dawn",
    attempt=1,
    user_style={"COLOR_PREFERENCES": "purple, blue", "DISLIKED_ELEMENTS": ["cheerful aesthetics"]},
    series={},
    winning_patterns=["slow dolly-in"],
    failure_patterns=["jittery, unstable motion"],
    past_successes=["a grey wolf on a ridge at dusk, slow dolly-in, purple sky"],
)


@pytest.mark.timeout(1200)  # a dozen real calls or more: about 100 s alone, past 600 s beside another model's server
def test_every_role_answers_a_real_model_with_a_validated_reply(clean, real_llm):
    """Director (batch, series, A/B, style), Writer, Cameraman and sleeptime on the real model."""
    settings = _llm_settings(clean, real_llm.url)
    crew = llm_agents(settings, STUDIO)
    plan = crew.director.plan(ProductionRequest(text="x", kind="batch", count=3, theme="mythical creatures"))
    assert len(plan.videos) == 3 and all(v.concept.strip() for v in plan.videos)
    series = crew.director.plan(
        ProductionRequest(text="x", kind="series", count=2, theme="the guardian", series_name="Guardian")
    )
    assert len(series.videos) == 2
    ab = crew.director.plan(ProductionRequest(text="x", kind="ab", count=2, theme="a lighthouse in a storm"))
    assert [v.label for v in ab.videos] == ["A", "B"]
    crew.director.read_style("I like dark moody purple tones and slow pacing")
    # this 135M model now and then rambles past its token budget and copies that reply after its correction: the
    # studio writes the prompt then (nothing recorded), and a new write draws the model's first reply afresh
    for _ in range(3):
        draft = crew.writer.write(BRIEF)
        assert draft.prompt.strip() and draft.seed == draft_seed(BRIEF)  # the studio's, reproducible: not the model's
        if recall.context(settings, "writer").messages:
            break
    verdict = crew.cameraman.review(
        ReviewBrief(grade="D", scores={"sharpness": 0.3}, min_grade="B", attempt=3, max_retries=3)
    )
    assert verdict.action in ("accept", "fail")  # a refine past the last attempt is turned into a fail
    summary = crew.consolidator.consolidate(activity=["accepted: video 1 grade A after 1 attempts; a fox"])
    assert summary.summary.strip()
    # the exchanges are the agents' recall: each call's question and validated reply, in order
    writer = recall.context(settings, "writer").messages
    # one exchange or more (a draft the studio refuses or finds short of the style is asked again), of one write
    roles = [m.role for m in writer]
    assert roles == ["user", "assistant"] * (len(roles) // 2) and len(roles) >= 2, roles
    assert writer[0].content.startswith("TASK write")
    assert DraftReply.model_validate_json(writer[1].content).prompt
    _record_exchanges(settings, "every role on the real model")


def test_the_context_carries_core_memory_statistics_and_recall(clean, real_llm):
    settings = _llm_settings(clean, real_llm.url)
    agent = LLMAgent(settings, STUDIO, "writer")
    question = Question(
        task="write", payload={"brief": {"concept": "a heron"}}, shape='{"prompt": str}', reply=DraftReply
    )
    for tries_left in reversed(range(3)):  # the model now and then rambles past its budget: a call that never
        try:  # validated records nothing, and what is checked is the context, not the model
            agent.ask(question)
            break
        except LLMReplyError:
            if not tries_left:
                raise
    assert agent.last is not None and agent.last.prompt_tokens > 0 and agent.last.completion_tokens > 0
    # the stable part first (what a prefix cache serves again), what every step rewrites in the call itself
    stable, now = system_prompt(settings, STUDIO, "writer"), changing_memory(settings, STUDIO, "writer")
    for label in ("user_style", "quality_standards", "current_series", "ab_testing"):
        assert f"<{label}>" in stable and f"<{label}>" not in now
    for label in ("session_state", "production_queue"):
        assert f"<{label}>" in now and f"<{label}>" not in stable
    assert "archival memory: 0 passages" in now and "recall memory: 2 past messages of yours" in now


def test_calls_of_one_role_run_at_once_on_the_real_model_and_never_mix(clean, real_llm):
    """Three calls of the Writer at once go to three conversations: each holds whole exchanges only."""
    from concurrent.futures import ThreadPoolExecutor

    # what is checked is the order of the calls, not the model: more tries, so a rambling reply cut at the
    # token limit (this 135M model does that now and then) does not end a call early
    settings = _llm_settings(clean, real_llm.url, llm_reply_retries=6)
    question = Question(
        task="write", payload={"brief": {"concept": "a kite"}}, shape='{"prompt": str}', reply=DraftReply
    )
    with ThreadPoolExecutor(3) as pool:
        calls = [pool.submit(LLMAgent(settings, STUDIO, "writer").ask, question) for _ in range(3)]
    answered = [call for call in calls if call.exception() is None]
    for call in calls:  # a call the model never answered validly writes nothing, and may only fail that way
        assert call.exception() is None or isinstance(call.exception(), LLMReplyError), call.exception()
    assert len(answered) >= 2, [str(call.exception()) for call in calls]
    exchanges = 0
    for talk in recall.conversations("writer", settings.agents.conversations):
        roles = [m.role for m in recall.context(settings, talk).messages]
        assert roles == ["user", "assistant"] * (len(roles) // 2), talk
        exchanges += len(roles) // 2
    assert exchanges == len(answered)


def test_a_reply_cut_at_its_token_budget_is_seen_as_cut_on_the_real_model(clean, real_llm):
    """llama.cpp ends a forced tool call `tool_calls` even when the token limit cut it: the studio counts."""
    settings = _llm_settings(clean, real_llm.url, llm_reply_retries=0, llm_structured="tools")
    question = Question(
        task="write",
        payload={"brief": {"concept": "a phoenix, in two hundred words"}},
        shape='{"prompt": str}',
        reply=DraftReply,
        max_tokens=5,
    )
    with pytest.raises(LLMReplyError, match="the reply was cut at 5 tokens"):
        LLMAgent(settings, STUDIO, "writer").ask(question)


@pytest.mark.parametrize(
    "bad",
    [
        "Sure! Here is a lovely prompt about the fox.",  # prose
        '{"prompt": "a fox", "negative_prompt": ',  # broken JSON
        '{"text": "a fox"}',  # valid JSON, wrong shape
    ],
)
def test_a_malformed_reply_is_shown_its_error_then_the_studio_writes_the_prompt_saying_why(clean, bad):
    script = [bad.replace("fox", name) for name in ("fox", "red fox", "grey fox", "grey fox")]
    spaced_otherwise = "\n" + script[-1].replace('": ', '":\t')  # the same reply
    with FaultyLLM([*script, spaced_otherwise]) as llm:
        settings = _llm_settings(clean, llm.url, llm_reply_retries=2, llm_structured="json_schema")
        with pytest.raises(LLMReplyError) as failed:
            LLMAgent(settings, STUDIO, "writer").ask(
                Question(task="write", payload={}, shape='{"prompt": str}', reply=DraftReply)
            )
        assert not failed.value.retryable and "3 times without a valid reply" in str(failed.value)
        llm.requests.clear()
        # a write that never validates is the studio's prompt; the same invalid reply after its correction is
        # not asked for a third time
        draft = llm_agents(settings, STUDIO).writer.write(BRIEF)
        assert draft.source == "studio" and "2 times without a valid reply" in draft.note
        assert "the same invalid reply again" in draft.note
        assert draft.prompt.startswith(BRIEF.concept)
        assert len(llm.requests) == 2
        correction = llm.requests[1]["messages"][-1]["content"]
        assert correction.startswith("That reply is invalid:") and '"prompt": str' in correction
        schema = llm.requests[0]["response_format"]["json_schema"]["schema"]
        assert schema["required"] == ["prompt"] and "maxLength" not in json.dumps(schema)  # see Question.schema
    assert recall.context(settings, "writer").messages == ()  # nothing half-written into its memory


def test_a_style_reading_is_asked_without_the_conversations_earlier_messages(clean):
    """A small model hands back an earlier feedback of its conversation ("surprise me!" read as the last
    feedback, "honestly just make them good"): a reading is asked about its feedback alone, and remembered."""
    teal = json.dumps({"liked": [{"words": "teal", "aspect": "colour"}], "ruled_out": []})
    with FaultyLLM([json.dumps({"prompt": "a fox at dawn", "negative_prompt": ""}), teal]) as llm:
        settings = _llm_settings(clean, llm.url, llm_structured="json_schema")
        director = LLMAgent(settings, STUDIO, "director")
        director.ask(
            Question(
                task="write",
                payload={"feedback": "honestly just make them good"},
                shape='{"prompt": str}',
                reply=DraftReply,
            )
        )
        reading = llm_agents(settings, STUDIO).director.read_style("teal, lots of teal")
    assert reading.source == "model" and [i.words for i in reading.items] == ["teal"]
    asked = llm.requests[-1]["messages"]
    assert [m["role"] for m in asked] == ["system", "user"] and "teal, lots of teal" in asked[-1]["content"]
    assert "honestly just make them good" not in json.dumps(asked)
    remembered = [m.content for m in recall.context(settings, "director").messages]
    assert any("honestly just make them good" in c for c in remembered)
    assert any("teal, lots of teal" in c for c in remembered)


def test_a_corrected_reply_is_accepted_on_the_next_try(clean):
    good = "a red fox at dawn in purple and blue light"
    with FaultyLLM(['{"text": "a fox"}', json.dumps({"prompt": good, "negative_prompt": "blur"})]) as llm:
        settings = _llm_settings(clean, llm.url, llm_structured="prompt")
        draft = llm_agents(settings, STUDIO).writer.write(BRIEF)
    # the model's negative prompt, then what the user dislikes and the known failure patterns
    assert draft.prompt == good and draft.source == "model"
    assert draft.negative_prompt == "blur, cheerful aesthetics, jittery, unstable motion"
    assert "response_format" not in llm.requests[0] and "tools" not in llm.requests[0]


def test_a_reply_that_never_ends_and_a_server_that_is_down_are_retryable_in_bounded_time(clean):
    with FaultyLLM([HANG]) as llm:
        settings = _llm_settings(clean, llm.url, llm_timeout_seconds=2)
        started = time.monotonic()
        with pytest.raises(LLMUnavailable, match="no reply within 2 s") as hung:
            llm_agents(settings, STUDIO).writer.write(BRIEF)
        assert time.monotonic() - started < 10 and hung.value.retryable
    down = _llm_settings(clean, f"http://127.0.0.1:{free_port()}/v1")
    with pytest.raises(LLMUnavailable, match="cannot reach the LLM"):
        llm_agents(down, STUDIO).writer.write(BRIEF)


def test_the_api_key_is_sent_and_never_printed(clean):
    with FaultyLLM(["not json"]) as llm:
        settings = _llm_settings(clean, llm.url, llm_api_key=SecretStr("sk-secret-123"), llm_reply_retries=0)
        draft = llm_agents(settings, STUDIO).writer.write(BRIEF)
    assert llm.headers[0]["Authorization"] == "Bearer sk-secret-123"
    assert draft.source == "studio" and "sk-secret-123" not in draft.note and "sk-secret-123" not in repr(settings)
    assert settings.describe()["llm_api_key"] == "***"


# --- end to end, real workers ------------------------------------------------------------------------


FEEDBACK = "I prefer dark moody aesthetics with purple and blue tones"


@pytest.mark.xdist_group("llm-batches")  # a worker of its own under pytest -n: the module's longest tests
@pytest.mark.timeout(1500)  # the batches' own budget (1200 s) and the studio's start and stop
def test_a_series_an_ab_test_and_refinement_complete_on_the_real_model(tmp_path):
    """Real workers, the real model as every agent: a series, an A/B test, and a refinement round (the
    preview grader grades a prompt low unless it asks for sharp focus, a steady camera and dominant colours,
    which a model seldom does at once, so weak attempts are refined). A plain batch runs end to end on the
    real model in the server-down test below: not again here, where each video costs minutes of the cores."""
    from tests.studio import IsolatedStudio

    _need_server()
    # more reply retries than the default: a 135M model sometimes needs them, and a failed step is not the point
    # (a server of its own: calls the stopped workers left queued in it end with it, not in the next test's time)
    with (
        LocalLLM(tmp_path) as llm,
        IsolatedStudio(
            tmp_path / "studio", **_env(llm.url, MAS_AGENT_RETRIES="2", MAS_LLM_REPLY_RETRIES="4")
        ) as studio,
    ):
        studio.worker("cpu", concurrency=2)
        studio.worker("gpu")
        assert studio.mas("memory", "set", "quality_standards", "MAX_RETRIES", "2").returncode == 0
        learned = studio.mas("style", FEEDBACK)
        assert learned.returncode == 0, learned.stdout + learned.stderr
        user_style = blocks.read(studio.settings, STUDIO, "user_style")
        batches = []
        for command in (
            ["series", "Forest Guardian", "--episodes", "2"],
            ["ab", "a lighthouse in a storm", "--variations", "2"],
        ):
            result = studio.mas(*command)
            assert result.returncode == 0, result.stderr
            batches.append(int(re.search(r"batch (\d+)", result.stdout).group(1)))
        # one budget for all: the batches share one model server (about 20 calls of 5-20 s on 2 cores)
        deadline = time.monotonic() + 1200
        for batch_id in batches:
            studio.wait_batch(batch_id, timeout=max(1.0, deadline - time.monotonic()))
        videos = [v for b in batches for v in studio.videos(b)]
        with db.session_scope(studio.settings) as s:
            kinds = [s.get(Batch, b).kind for b in batches]
            prompts = s.scalars(sa.select(Attempt.prompt)).all()
        _record_exchanges(studio.settings, "a series and an A/B test on the real model")
    assert kinds == ["series", "ab"] and len(videos) == 4
    # what is stored is the model's reading when it validated (a 135M model may miss a colour): liked, of what
    # the user said, never ruled out; nothing when it never validated (not understood, never read by the rules);
    # and every prompt carries it
    learned = Style.of(user_style)
    said = set(re.findall(r"\w+", FEEDBACK.lower()))
    liked_words = {word for item in learned.liked for word in re.findall(r"\w+", item.words.lower())}
    assert (liked_words & said or not learned.items) and not learned.ruled_out, user_style
    for prompt in prompts:  # by meaning (violet is purple); a prompt the checks cannot read is the model's
        check = style_check.check(prompt, learned, StudioMeaning(studio.settings))
        assert check.applied or not check.checked, (prompt, check)
    assert all(v.state in (VideoState.accepted, VideoState.failed) for v in videos)
    assert not any("failed:" in r for v in videos for r in (v.failure_reasons or []))  # no step failed
    assert any(v.attempt_count > 1 for v in videos), "no refinement round ran"


@pytest.mark.xdist_group("llm-server-down")
def test_a_batch_waits_for_a_server_that_is_down_and_resumes_when_it_returns(tmp_path):
    from tests.studio import IsolatedStudio

    _need_server()

    port = free_port()
    # one attempt per video (MAS_MAX_RETRIES=1): the wait and the resumption are the point, not refinement,
    # whose real-model calls take minutes on 2 cores
    env = _env(
        f"http://127.0.0.1:{port}/v1",
        MAS_AGENT_RETRY_BACKOFF_MAX_SECONDS="1",
        MAS_PEER_WAIT_SECONDS="600",
        MAS_MAX_RETRIES="1",
    )
    with IsolatedStudio(tmp_path / "studio", **env) as studio:
        cpu = studio.worker("cpu")
        studio.worker("gpu")
        batch_id = studio.enqueue("Create 1 video of a dragon")
        studio.wait_until(lambda: cpu.log.read_text().count("waits for a peer") >= 2, timeout=60, what="a wait")
        with db.session_scope(studio.settings) as s:
            assert s.get(Batch, batch_id).status == BatchStatus.queued  # waiting, not failed
        with LocalLLM(tmp_path, port=port):
            studio.wait_batch(batch_id, timeout=300)
        videos = studio.videos(batch_id)
    # a plain batch end to end on the real model: planned, written, rendered and reviewed, no step failed
    assert len(videos) == 1 and videos[0].state in (VideoState.accepted, VideoState.failed), videos
    assert not any("failed:" in r for r in (videos[0].failure_reasons or [])), videos[0].failure_reasons


@pytest.mark.parametrize(
    "script, reason",
    [
        ([HANG], "no reply within 1 s"),
    ],
)
def test_a_batch_whose_planning_cannot_succeed_ends_failed_with_the_reason(tmp_path, script, reason):
    from tests.studio import IsolatedStudio

    with FaultyLLM(script) as llm:
        env = _env(
            llm.url,
            MAS_LLM_TIMEOUT_SECONDS="1",
            MAS_AGENT_RETRY_BACKOFF_MAX_SECONDS="1",
            MAS_PEER_WAIT_SECONDS="3",
            MAS_LLM_STRUCTURED="json_schema",
        )
        with IsolatedStudio(tmp_path / "studio", **env) as studio:
            studio.worker("cpu")
            started = time.monotonic()
            result = studio.mas("enqueue", "--wait", "Create 2 videos of dragons", timeout=120)
            assert result.returncode == 1 and reason in result.stderr, result.stdout + result.stderr
            assert time.monotonic() - started < 90 and "Traceback" not in result.stderr
            batch_id = int(result.stdout.split()[1].rstrip(":"))
            with db.session_scope(studio.settings) as s:
                batch = s.get(Batch, batch_id)
                assert batch.status == BatchStatus.failed and reason in batch.failure_reason
            assert studio.videos(batch_id) == []  # nothing half-written


def test_a_batch_whose_agents_answer_prose_is_made_by_the_studios_own_rules_and_says_so(tmp_path):
    """Every reply prose: the plan, every prompt and every verdict are the studio's, each marked, and the
    batch ends as its grades say (never failed by the model's formatting)."""
    from tests.studio import IsolatedStudio

    with FaultyLLM(["I think the videos should be lovely."]) as llm:
        env = _env(llm.url, MAS_LLM_STRUCTURED="json_schema", MAS_LLM_REPLY_RETRIES="1")
        with IsolatedStudio(tmp_path / "studio", **env) as studio:
            studio.worker("cpu")
            studio.worker("gpu")
            result = studio.mas("enqueue", "--wait", "Create 2 videos of dragons", timeout=300)
            batch_id = int(result.stdout.split()[1].rstrip(":"))
            videos = studio.videos(batch_id)
            with db.session_scope(studio.settings) as s:
                attempts = s.scalars(sa.select(Attempt).where(Attempt.video_id.in_([v.id for v in videos]))).all()
                assert s.get(Batch, batch_id).status == BatchStatus.done
    accepted = sum(v.state == VideoState.accepted for v in videos)
    failed = sum(v.state == VideoState.failed for v in videos)
    assert accepted + failed == 2 and result.returncode == (1 if failed else 0), result.stdout + result.stderr
    assert f"batch {batch_id} done: {accepted} accepted, {failed} failed of 2 videos" in result.stdout + result.stderr
    assert [v.concept for v in videos] == ["dragons, at dawn, low golden mist", "dragons, in a thunderstorm"]
    assert attempts and all(a.prompt_source == "studio" and a.review_source == "studio" for a in attempts)
    assert all(a.prompt.startswith("dragons") and "never validated" in a.studio_notes[0] for a in attempts)


# --- the user's taste picks among the Writer's candidates ----------------------------------------------


def _pick(settings: Settings, chosen: str, rejected: str, n: int) -> None:
    from mas.models import ABSelection, ABTest

    with db.session_scope(settings) as s:
        for _ in range(n):
            test = ABTest(concept="c", status="closed", winner_label="A")
            s.add(test)
            s.flush()
            s.add(
                ABSelection(
                    test_id=test.id, chosen_label="A", chosen_prompt=chosen, rejected_prompts=[rejected], concept="c"
                )
            )


def test_the_writer_picks_the_candidate_the_users_taste_prefers(clean):
    from mas import agents
    from mas.learning.promotion import ranker, served, tune_taste
    from mas.learning.taste import Option

    neon, pastoral = "a neon-lit cyberpunk alley at night, rain", "a sunny meadow with sheep, soft pastoral light"
    brief = WriterBrief(
        concept="a place at night or in soft light",
        attempt=1,
        user_style={},
        series={},
        winning_patterns=[],
        failure_patterns=[],
        past_successes=[],
    )
    _pick(clean, chosen="a neon city street at night, glowing signs", rejected="a quiet farm field at noon", n=4)
    _pick(clean, chosen="cyberpunk rooftops in neon rain", rejected="cows grazing on a green hillside", n=4)
    report = tune_taste(clean, STUDIO)
    assert report.promoted and report.pairs == 8, report.reason
    learned = served(clean, STUDIO).taste
    assert learned.choice_probabilities([Option(prompt=neon), Option(prompt=pastoral)], settings=clean)[0] > 0.6
    reply = json.dumps({"candidates": [{"prompt": pastoral}, {"prompt": neon}]})
    with FaultyLLM([reply]) as llm:
        settings = _llm_settings(clean, llm.url, writer_candidates=2, llm_structured="json_schema")
        draft = agents.backend(settings, STUDIO, rank=ranker(settings, STUDIO)).writer.write(brief)
    assert draft.prompt == neon  # the model's first candidate lost to the user's taste
    schema = llm.requests[0]["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["candidates"]["minItems"] == 2


def test_without_enough_picks_the_models_first_candidate_wins(clean):
    from mas import agents

    first, second = "a red fox in snow at dawn, purple and blue sky", "a red fox asleep at dawn in blue and purple"
    reply = json.dumps({"candidates": [{"prompt": first}, {"prompt": second}]})
    with FaultyLLM([reply]) as llm:
        settings = _llm_settings(clean, llm.url, writer_candidates=2, llm_structured="json_schema")
        assert agents.backend(settings, STUDIO).writer.write(BRIEF).prompt == first


def test_a_candidate_that_is_not_a_prompt_is_never_chosen(clean):
    from mas import agents

    good = "a red fox in snow at dawn, purple and blue sky"
    reply = json.dumps({"candidates": [{"prompt": "write"}, {"prompt": good}]})
    with FaultyLLM([reply]) as llm:
        settings = _llm_settings(clean, llm.url, writer_candidates=2, llm_structured="json_schema")
        assert agents.backend(settings, STUDIO).writer.write(BRIEF).prompt == good
