"""The Letta backend against a real Letta server (letta 0.16.8) that these tests start themselves.

The server runs from its own cached virtualenv (build it once with `bash scripts/letta-server-env.sh`;
without it the server tests skip and say so), on its own PostgreSQL + pgvector (pgserver's binaries, a
data folder of its own, TCP on loopback), migrated with the sdist's alembic scripts.

The LLM behind it is a STAND-IN (`tests/letta_llm.py`), not a model: an OpenAI-compatible endpoint that
answers each role task with the offline backend's rules, edits memory deterministically as a sleeptime
agent, and summarizes in a fixed sentence. What is tested here is the plumbing — provisioning, messages
and replies, sleeptime groups, autoclear, compaction and reset — not the quality of any model.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from pydantic import SecretStr

from mas import db
from mas.agents import letta as backend
from mas.agents import protocol
from mas.agents.letta import maintenance as maint
from mas.agents.letta import prompts
from mas.agents.letta.replies import reply_candidates
from mas.agents.offline import (
    OfflineCameraman,
    OfflineConsolidator,
    OfflineDirector,
    OfflineWriter,
)
from mas.agents.reading import as_reply
from mas.agents.replies import parse_json_object
from mas.agents.roles import ReviewBrief, WriterBrief
from mas.domain.identity import STUDIO, Actor
from mas.domain.requests import ProductionRequest
from mas.errors import RetryableError
from mas.memory import blocks as studio_blocks
from mas.memory.blocks import SCHEMAS, BlockError, defaults
from mas.models import Batch, BatchStatus
from tests.parts import need

ROOT = Path(__file__).resolve().parents[2]
LETTA_VERSION = "0.16.8"
# where scripts/letta-server-env.sh builds it: a cache outside the checkout, keyed by version
LETTA_VENV = Path(
    os.environ.get("LETTA_VENV")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mas" / f"letta-venv-{LETTA_VERSION}"
)
MODEL = "openai-proxy/gpt-4o-mini"  # how Letta names the stand-in's model (an OpenAI-compatible base URL)
EMBEDDING = "openai/text-embedding-3-small"
SERVER_START_TIMEOUT_S = 240


# --- no server needed ----------------------------------------------------------------------------------


# --- the server ----------------------------------------------------------------------------------------


class LettaServer:
    """A Letta server process on loopback, its PostgreSQL, and the stand-in LLM it calls."""

    def __init__(self, base: Path):
        from tests.letta_llm import StandInLLM

        self.base = base
        self.home = base / "home"  # letta writes ~/.letta
        self.home.mkdir(parents=True)
        self.pgdata = base / "pg"
        self.log = base / "letta-server.log"
        self.token = secrets.token_urlsafe(16)
        self.llm = StandInLLM().start()
        self.process: subprocess.Popen | None = None
        self.pg_user: str | None = None
        self.timings: dict[str, float] = {}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LettaServer:
        t0 = time.monotonic()
        pg_port = self._start_postgres()
        self.timings["postgres_s"] = time.monotonic() - t0
        t0 = time.monotonic()
        self._migrate(pg_port)
        self.timings["migrations_s"] = time.monotonic() - t0
        t0 = time.monotonic()
        self._start_server(pg_port)
        self.timings["server_s"] = time.monotonic() - t0
        return self

    def _start_postgres(self) -> int:
        """pgserver's PostgreSQL (run as its non-root user under root), then restarted on a TCP port.

        Letta rebuilds its database URL from parts and cannot express pgserver's unix socket, so the
        server listens on 127.0.0.1 instead.
        """
        import pgserver
        from pgserver._commands import pg_ctl
        from pgserver.utils import find_suitable_port

        server = pgserver.get_server(self.pgdata, cleanup_mode=None)
        server.psql("create database letta;")
        server.psql("\\c letta\ncreate extension if not exists vector;")
        self.pg_user = server.system_user
        pg_ctl(["-w", "stop"], pgdata=self.pgdata, user=self.pg_user, timeout=60)
        port = find_suitable_port("127.0.0.1")
        pg_ctl(
            ["-w", "-o", "-h 127.0.0.1", "-o", f"-p {port}", "-o", f"-k {self.pgdata}", "-l",
             str(self.pgdata / "log"), "start"],
            pgdata=self.pgdata, user=self.pg_user, timeout=60,
        )
        return port

    def _env(self, pg_port: int, *, query: str = "") -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ", "TMPDIR")}
        env.update(
            HOME=str(self.home),
            LETTA_PG_URI=f"postgresql://postgres@127.0.0.1:{pg_port}/letta{query}",
            LETTA_DISABLE_SQLALCHEMY_POOLING="false",  # without pooling new connections stalled for 60 s
            OPENAI_BASE_URL=self.llm.url,
            OPENAI_API_KEY="stand-in",
            LETTA_SERVER_SECURE="true",
            LETTA_SERVER_PASSWORD=self.token,
        )
        return env

    def _migrate(self, pg_port: int) -> None:
        result = subprocess.run(
            [str(LETTA_VENV / "bin" / "alembic"), "upgrade", "head"],
            cwd=LETTA_VENV / "letta-src", env=self._env(pg_port), capture_output=True, text=True, timeout=300,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"Letta migrations failed:\n{result.stderr[-3000:]}")

    def _start_server(self, pg_port: int) -> None:
        from pgserver.utils import find_suitable_port

        self.port = find_suitable_port("127.0.0.1")
        self.process = subprocess.Popen(
            [str(LETTA_VENV / "bin" / "letta"), "server", "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=self.base, env=self._env(pg_port, query="?sslmode=disable"),
            stdout=self.log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
        )
        import httpx

        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the Letta server exited:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/v1/health/", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"the Letta server did not answer in {SERVER_START_TIMEOUT_S} s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, 15)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                self.process.wait()
        pidfile = self.pgdata / "postmaster.pid"
        if pidfile.exists():
            from pgserver._commands import pg_ctl

            try:
                pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.pgdata, user=self.pg_user, timeout=60)
            except Exception:
                with contextlib.suppress(OSError, ValueError):
                    os.kill(int(pidfile.read_text().split()[0]), 2)
        self.llm.stop()


def _skip_reason() -> str | None:
    ready = LETTA_VENV / "mas-letta-ready"
    if not ready.is_file() or ready.read_text().strip() != f"letta=={LETTA_VERSION}":
        return (
            f"no cached Letta server virtualenv at {LETTA_VENV} (letta=={LETTA_VERSION}): build it with "
            "`bash scripts/letta-server-env.sh` (about 1.5 minutes, once)"
        )
    try:
        import letta_client  # noqa: F401
    except ImportError:
        return "letta-client is not installed: pip install -e '.[letta]'"
    if shutil.which("tar") is None:  # pragma: no cover
        return "no tar"
    return None


def _unavailable(reason: str):
    """Skip with the reason; fail instead where MAS_TEST_REQUIRE_LETTA is set (CI, after the setup script)."""
    need("LETTA", reason)


@pytest.fixture(scope="module")
def letta_server(tmp_path_factory):
    reason = _skip_reason()
    if reason:
        _unavailable(reason)
    # Not under pytest's temporary folder: another pytest run resets /tmp/pytest-of-<user> to 0700, and
    # the PostgreSQL user (non-root) would lose its way to the data folder mid-run.
    base = Path(tempfile.mkdtemp(prefix="mas-letta-"))
    base.chmod(0o755)
    server = LettaServer(base)
    try:
        server.start()
        print(f"\nLetta server ready: {', '.join(f'{k} {v:.1f}' for k, v in server.timings.items())}")
        yield server
    finally:
        server.stop()
        logs = tmp_path_factory.mktemp("letta-logs")
        for log in (server.log, server.pgdata / "log"):
            if log.exists():
                shutil.copy(log, logs / log.name)
        shutil.rmtree(base, ignore_errors=True)


LETTA_CONVERSATIONS = 2
"""Agents per role: enough to show they share everything but their talk (provisioning costs seconds each)."""


@pytest.fixture(scope="module")
def letta_settings(settings, letta_server):
    """The studio's test settings (its PostgreSQL holds the advisory locks) pointed at the Letta server."""
    backend.forget()
    return settings.model_copy(update={
        "agent_backend": "letta", "letta_url": letta_server.url, "letta_token": SecretStr(letta_server.token),
        "letta_model": MODEL, "letta_embedding": EMBEDDING,
        "agent_conversations": LETTA_CONVERSATIONS,
    })


@pytest.fixture
def down_settings(settings):
    """Settings naming a Letta server that is not there (nothing listens on port 9)."""
    try:
        import letta_client  # noqa: F401
    except ImportError:
        _unavailable("letta-client is not installed: pip install -e '.[letta]'")
    backend.forget()
    return settings.model_copy(update={"agent_backend": "letta", "letta_url": "http://127.0.0.1:9", "letta_model": MODEL})


@pytest.fixture(scope="module")
def api(letta_settings):
    return backend.client(letta_settings)


@pytest.fixture(scope="module")
def provisioned(letta_settings, api):  # noqa: ARG001  # `api`: the server is up
    """The first provisioning of the fresh server (the module's tests run against what it made)."""
    return backend.provision(letta_settings, STUDIO)


def _all_agents(api) -> list:
    return list(api.agents.list())


# --- provisioning --------------------------------------------------------------------------------------


def test_provisioning_creates_the_studio_once(letta_settings, api, provisioned):
    assert provisioned.changed == []
    crew = ["director", "director.1", "writer", "writer.1", "cameraman", "cameraman.1"]
    assert backend.crew_conversations(letta_settings) == crew
    assert sorted(provisioned.created) == sorted([f"block {label}" for label in SCHEMAS] + [f"agent {c}" for c in crew])
    assert set(provisioned.blocks) == set(SCHEMAS) and set(provisioned.agents) == set(crew)

    # the six blocks hold their Appendix B defaults as JSON and are shared by every agent and companion
    store = backend.LettaBlockStore(letta_settings, STUDIO)
    for label in SCHEMAS:
        value = store.read(label)
        expected = defaults(label, letta_settings)
        if label == "session_state":
            value.pop("LAST_ACTIVITY"), expected.pop("LAST_ACTIVITY")
        assert value == expected
    for role, ids in provisioned.agents.items():
        agent = api.agents.retrieve(ids.id, include=["agent.blocks", "agent.tags", "agent.managed_group"])
        assert agent.name == role.replace(".", "_") and set(agent.tags) >= {"mas", f"mas:{role.split('.')[0]}"}
        assert {b.label: b.id for b in agent.blocks if b.label in SCHEMAS} == provisioned.blocks
        assert agent.managed_group.manager_type == "sleeptime"
        assert backend.sleeptime_frequency(api, ids.group_id) == letta_settings.memory.sleeptime_frequency == 5
        assert len(ids.sleeptime_ids) == 1
        companion = api.agents.retrieve(ids.sleeptime_ids[0], include=["agent.blocks"])
        assert companion.name == f"{agent.name}-sleeptime" and companion.message_buffer_autoclear is True
        assert {b.label: b.id for b in companion.blocks if b.label in SCHEMAS} == provisioned.blocks
        assert next(b.value for b in companion.blocks if b.label == "memory_persona") == prompts.SLEEPTIME_PERSONA

    # provisioning again finds everything: nothing created, nothing changed, no duplicates
    agents_before = sorted(a.id for a in _all_agents(api))
    blocks_before = sorted(b.id for b in api.blocks.list(tags=["mas"]))
    again = backend.provision(letta_settings, STUDIO)
    assert again.created == [] and again.changed == []
    assert again.blocks == provisioned.blocks and again.agents == provisioned.agents
    assert sorted(a.id for a in _all_agents(api)) == agents_before and len(agents_before) == 12
    assert sorted(b.id for b in api.blocks.list(tags=["mas"])) == blocks_before and len(blocks_before) == 6
    assert backend.find(letta_settings, STUDIO) == backend.Provisioned(blocks=again.blocks, agents=again.agents)


def test_provisioning_repairs_drift_and_applies_the_frequency(letta_settings, api, provisioned):
    writer = provisioned.agents["writer"]
    companion = writer.sleeptime_ids[0]
    api.agents.blocks.detach(provisioned.blocks["ab_testing"], agent_id=writer.id)
    api.agents.update(companion, message_buffer_autoclear=False)
    backend.set_sleeptime_frequency(api, writer.group_id, 2)

    repaired = backend.provision(letta_settings.model_copy(update={"sleeptime_frequency": 7}), STUDIO)
    assert repaired.created == []
    assert "writer: attached block ab_testing" in repaired.changed
    assert "writer-sleeptime: message_buffer_autoclear on" in repaired.changed
    assert "writer: sleeptime frequency 2 -> 7" in repaired.changed
    assert "director: sleeptime frequency 5 -> 7" in repaired.changed
    assert api.agents.retrieve(companion).message_buffer_autoclear is True
    assert all(backend.sleeptime_frequency(api, ids.group_id) == 7 for ids in repaired.agents.values())

    back = backend.provision(letta_settings, STUDIO)  # and back to the settings' 5
    assert all(backend.sleeptime_frequency(api, ids.group_id) == 5 for ids in back.agents.values())
    assert backend.provision(letta_settings, STUDIO).changed == []


def test_status_reports_agents_blocks_counts_and_frequency_without_the_token(letta_settings, provisioned):
    state = backend.status(letta_settings, STUDIO)
    assert state.healthy and state.version == LETTA_VERSION and state.provisioned
    assert state.blocks == provisioned.blocks
    for agent in state.agents:
        assert agent.id == provisioned.agents[agent.role].id and agent.problems == []
        assert agent.in_context >= 1 and agent.sleeptime_frequency == 5
        assert [c.autoclear for c in agent.companions] == [True]
        assert agent.block_ids == provisioned.blocks
    token = letta_settings.letta.token.get_secret_value()
    assert token not in repr(state) and token not in json.dumps(asdict(state), default=str)


def test_a_wrong_token_is_a_clear_error_that_does_not_print_the_token(letta_settings):
    wrong = letta_settings.model_copy(update={"letta_token": SecretStr("not-the-token")})
    with pytest.raises(backend.LettaError) as caught:
        backend.find(wrong, STUDIO)
    assert "MAS_LETTA_TOKEN" in str(caught.value) and "not-the-token" not in str(caught.value)
    assert not isinstance(caught.value, RetryableError)
    assert backend.health(wrong).ok is False and "MAS_LETTA_TOKEN" in backend.health(wrong).detail


# --- the roles -----------------------------------------------------------------------------------------


def _brief(attempt: int = 1) -> WriterBrief:
    return WriterBrief(
        concept="a phoenix, at dawn", attempt=attempt,
        user_style={"COLOR_PREFERENCES": "purple, blue", "MOOD_PREFERENCES": "moody", "DISLIKED_ELEMENTS": ["warm orange and yellow tones"]},
        series={}, winning_patterns=["slow dolly-in"], failure_patterns=["jittery, unstable motion"], past_successes=[],
    )


def test_every_role_call_goes_through_letta_and_reads_the_structured_reply(letta_settings, letta_server, provisioned):
    crew = backend.letta_agents(letta_settings, STUDIO)
    llm = letta_server.llm
    before = llm.count("role")

    for request in (
        ProductionRequest(text="Create 3 videos of dragons", kind="batch", count=3, theme="dragons"),
        ProductionRequest(text="a 2-part Guardians series", kind="series", count=2, theme="guardians", series_name="Guardians"),
        ProductionRequest(text="2 variations of a kraken", kind="ab", count=2, theme="a kraken"),
    ):
        assert crew.director.plan(request, episodes_done=1) == OfflineDirector().plan(request, episodes_done=1)
    feedback = "I prefer dark moody aesthetics with purple and blue tones and slow pacing"
    assert crew.director.read_style(feedback).items == OfflineDirector().read_style(feedback).items
    brief = _brief()
    # the same decisions, written by the model (the stand-in) where the offline backend's are the studio's
    assert crew.writer.write(brief) == replace(OfflineWriter().write(brief), source="model")
    for grade, attempt in (("A", 1), ("D", 1), ("D", 3)):
        kwargs = {"grade": grade, "scores": {"sharpness": 0.4, "smoothness": 0.9, "palette": 0.8}, "min_grade": "B",
                  "attempt": attempt, "max_retries": 3}
        judged = ReviewBrief(**kwargs)
        assert crew.cameraman.review(judged) == replace(OfflineCameraman().review(judged), source="model")
    activity = ["accepted: video 1 grade A after 1 attempts; a phoenix, steady camera, smooth slow motion"]
    assert crew.consolidator.consolidate(activity=activity) == OfflineConsolidator().consolidate(activity=activity)

    # 9 role calls, each answered through the stand-in as a send_message tool call (sleeptime agents)
    assert llm.count("role") - before == 9
    director = provisioned.agents["director"].id
    api = backend.client(letta_settings)
    last = list(api.agents.messages.list(director, limit=4, order="desc", use_assistant_message=False))
    assert any(m.message_type == "tool_call_message" and m.tool_call.name == "send_message" for m in last)


@pytest.mark.usefixtures("letta_settings")
def test_an_agent_without_send_message_answers_with_an_assistant_message(api):
    """Letta agents without sleeptime reply with plain assistant messages; the same parser reads them."""
    scratch = api.agents.create(name="scratch-no-sleeptime", model=MODEL, embedding=EMBEDDING, system="You answer tasks.")
    try:
        text = protocol.task_message("read_style", {"feedback": "bright cheerful colors"}, "{}")
        response = api.agents.messages.create(scratch.id, messages=[{"role": "user", "content": text}])
        assert "assistant_message" in [m.message_type for m in response.messages]
        assert "tool_call_message" not in [m.message_type for m in response.messages]
        replies = reply_candidates(response)
        assert parse_json_object(replies[-1]) == as_reply(OfflineDirector().read_style("bright cheerful colors").items)
    finally:
        api.agents.delete(scratch.id)


@pytest.mark.usefixtures("provisioned")
def test_an_unparseable_reply_is_a_retryable_failure(letta_settings, letta_server):
    crew = backend.letta_agents(letta_settings, STUDIO)
    letta_server.llm.garbage_replies = 1
    with pytest.raises(backend.LettaReplyError) as caught:
        crew.cameraman.review(ReviewBrief(grade="A", scores={}, min_grade="B", attempt=1, max_retries=3))
    assert isinstance(caught.value, RetryableError)
    assert caught.value.agent == "cameraman" and caught.value.task == "review"
    assert "no JSON object" in str(caught.value) and "Sure!" in str(caught.value)
    # the retry (what Celery does) succeeds
    assert crew.cameraman.review(ReviewBrief(grade="A", scores={}, min_grade="B", attempt=1, max_retries=3)).action == "accept"


@pytest.mark.usefixtures("letta_server", "provisioned")
def test_a_refinement_never_exceeds_max_retries(letta_settings, monkeypatch):
    from tests import letta_llm

    monkeypatch.setattr(letta_llm, "answer_task", lambda task, payload: {"action": "refine", "failure_reasons": ["soft"], "strategy": "sharpen"})  # noqa: ARG005
    verdict = backend.letta_agents(letta_settings, STUDIO).cameraman.review(ReviewBrief(grade="F", scores={}, min_grade="B", attempt=3, max_retries=3))
    # the grader's reasons (none weak: no scores) first, then the model's
    assert verdict.action == "fail" and verdict.failure_reasons == ["below the minimum grade on every axis", "soft"]


def test_an_unreachable_server_is_a_retryable_failure_and_an_unhealthy_status(down_settings):
    with pytest.raises(backend.LettaUnavailable) as caught:
        backend.letta_agents(down_settings, STUDIO, serialize=False).writer.write(_brief())
    assert isinstance(caught.value, RetryableError) and "unreachable" in str(caught.value)
    assert backend.health(down_settings).ok is False
    state = backend.status(down_settings, STUDIO)
    assert not state.healthy and not state.provisioned and "unreachable" in state.error


# --- sleeptime -----------------------------------------------------------------------------------------


def _wait(condition, *, timeout: float = 60, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.25)
    raise TimeoutError(f"timed out waiting for {what}")


def _idle(api, agent_id: str) -> bool:
    """No run of this agent is still going (sleeptime runs are background runs)."""
    return not any(r.status in ("created", "running") for r in api.runs.list(agent_id=agent_id, limit=10))


def test_sleeptime_companions_run_every_n_turns_and_start_from_a_clear_buffer(letta_settings, letta_server, api, provisioned):
    llm = letta_server.llm
    writer = provisioned.agents["writer"]
    companion = writer.sleeptime_ids[0]
    crew = backend.letta_agents(letta_settings, STUDIO)
    store = backend.LettaBlockStore(letta_settings, STUDIO)
    store.update("session_state", {"LAST_ACTIVITY": "2000-01-01T00:00:00+00:00"})

    def runs() -> list[dict]:  # the first step of each sleeptime run, as the stand-in saw it
        return llm.find("sleeptime", step="rethink")

    seen = len(runs())
    for attempt in range(1, 11):  # 10 turns at frequency 5: the companion runs (at least) twice
        crew.writer.write(_brief(attempt))
    _wait(lambda: len(runs()) - seen >= 2, what="two sleeptime runs")
    _wait(lambda: _idle(api, companion), what="the sleeptime runs to finish")

    # every run edited the shared block (still valid JSON) and started from a clear buffer: the model saw
    # only its system prompt and the transcript to review, never an earlier run
    assert store.read("session_state")["LAST_ACTIVITY"] > "2000-01-01T00:00:00+00:00"
    assert [run["messages"] for run in runs()[seen:]] == [2] * (len(runs()) - seen)
    kept = len(api.agents.retrieve(companion).message_ids)
    assert kept <= 6  # what Letta keeps is one run at most (system, transcript, two tool calls and returns)
    assert len(api.agents.retrieve(writer.id).message_ids) > 20  # the primary agent keeps its history

    # without autoclear the next run sees the previous runs' messages: what autoclear prevents
    api.agents.update(companion, message_buffer_autoclear=False)
    try:
        seen = len(runs())
        for attempt in range(11, 16):
            crew.writer.write(_brief(attempt))
        _wait(lambda: len(runs()) > seen, what="a sleeptime run")
        _wait(lambda: _idle(api, companion), what="the sleeptime run to finish")
        assert runs()[seen]["messages"] > 2
    finally:
        assert backend.provision(letta_settings, STUDIO).changed == ["writer-sleeptime: message_buffer_autoclear on"]


# --- core memory blocks --------------------------------------------------------------------------------


def test_block_store_keeps_json_validates_and_refuses_oversized_values(letta_settings, api, provisioned):
    store = backend.LettaBlockStore(letta_settings, STUDIO)
    new = store.update("user_style", {"COLOR_PREFERENCES": "purple, blue"})
    assert new["COLOR_PREFERENCES"] == "purple, blue" and store.read("user_style") == new
    raw = api.blocks.retrieve(provisioned.blocks["user_style"]).value
    assert json.loads(raw) == new
    before = store.read("quality_standards")["FAILURE_PATTERNS_TO_AVOID"]  # earlier role calls pushed the studio's
    assert store.update("quality_standards", lambda v: {"FAILURE_PATTERNS_TO_AVOID": v["FAILURE_PATTERNS_TO_AVOID"] + ["soft"]})["FAILURE_PATTERNS_TO_AVOID"] == [*before, "soft"]

    with pytest.raises(BlockError, match="no field"):
        store.update("user_style", {"NOPE": 1})
    with pytest.raises(BlockError, match="MAX_RETRIES"):
        store.update("quality_standards", {"MAX_RETRIES": "three"})
    with pytest.raises(BlockError, match="over its cap"):
        store.update("user_style", {"FAVORITE_SUCCESSES": ["x" * 100] * 60})
    with pytest.raises(BlockError, match="unknown memory block"):
        store.read("nope")
    assert store.read("user_style") == new  # refused updates changed nothing

    api.blocks.update(provisioned.blocks["ab_testing"], value="ACTIVE_TEST: none")  # a model broke the JSON
    try:
        with pytest.raises(BlockError, match="no valid JSON"):
            store.read("ab_testing")
    finally:
        api.blocks.update(provisioned.blocks["ab_testing"], value=json.dumps(defaults("ab_testing", letta_settings)))
    assert store.read_all().keys() == SCHEMAS.keys()

    # a block deleted on the server: the next read provisions it again, with its defaults, attached to all
    api.blocks.delete(provisioned.blocks["current_series"])
    assert store.read("current_series") == defaults("current_series", letta_settings)
    found = backend.find(letta_settings, STUDIO)
    assert found.blocks["current_series"] != provisioned.blocks["current_series"]
    for ids in found.agents.values():
        for agent_id in (ids.id, *ids.sleeptime_ids):
            attached = api.agents.retrieve(agent_id, include=["agent.blocks"]).blocks
            assert found.blocks["current_series"] in {b.id for b in attached}


@pytest.mark.usefixtures("provisioned")
def test_role_calls_bring_the_servers_blocks_up_to_date_with_the_studio(letta_settings):
    """Postgres holds the studio's blocks; a role call first pushes the ones that changed since the last push."""
    crew = backend.letta_agents(letta_settings, STUDIO)
    store = backend.LettaBlockStore(letta_settings, STUDIO)
    studio_blocks.update(letta_settings, STUDIO, "user_style", {"PACING_PREFERENCES": "slow, meditative"}, by="user")
    crew.cameraman.review(ReviewBrief(grade="A", scores={}, min_grade="B", attempt=1, max_retries=3))
    assert store.read("user_style") == studio_blocks.read(letta_settings, STUDIO, "user_style")

    # nothing changed in the studio: nothing is written (an edit on the server stays until the studio's next)
    store.update("user_style", {"MOOD_PREFERENCES": "edited on the server"})
    assert backend.push_studio_blocks(letta_settings, STUDIO) == []
    assert store.read("user_style")["MOOD_PREFERENCES"] == "edited on the server"
    studio_blocks.update(letta_settings, STUDIO, "user_style", {"MOOD_PREFERENCES": "calm"}, by="user")
    assert backend.push_studio_blocks(letta_settings, STUDIO) == ["user_style"]
    assert store.read("user_style") == studio_blocks.read(letta_settings, STUDIO, "user_style")


# --- maintenance ---------------------------------------------------------------------------------------


def _fill(crew, api, agent_id: str, at_least: int) -> int:
    """Role calls until the agent holds at least `at_least` in-context messages (3 per call)."""
    while (n := len(api.agents.retrieve(agent_id).message_ids)) < at_least:
        crew.cameraman.review(ReviewBrief(grade="A", scores={}, min_grade="B", attempt=1, max_retries=3))
    return n


def test_maintenance_compacts_at_warn_and_resets_at_critical_emergency_and_after_failed_compactions(
    letta_settings, letta_server, api, provisioned, caplog
):
    settings = letta_settings.model_copy(update={"buffer_warn": 12, "buffer_critical": 20, "buffer_emergency": 26, "max_failed_summaries": 2})
    crew = backend.letta_agents(settings, STUDIO)
    agent = provisioned.agents["cameraman"].id
    maint.reset(api, agent)

    def run():
        return maint.maintain_agent(settings, api, "cameraman", agent)

    ok = run()
    assert (ok.action, ok.level, ok.count_before, ok.count_after) == ("ok", "ok", 1, 1)

    before = _fill(crew, api, agent, 12)
    summarized = run()  # warn: compact (Letta summarizes the oldest messages through the stand-in)
    assert (summarized.action, summarized.level, summarized.count_before) == ("summarize", "warn", before)
    assert summarized.count_after < before and "compacted" in summarized.reason

    letta_server.llm.fail_summaries = True
    try:
        before = _fill(crew, api, agent, 12)
        first = run()  # a failed compaction is counted (on the agent, on the server) and nothing moves
        assert (first.action, first.count_before, first.count_after) == ("summarize", before, before)
        assert "1 of 2 failures" in first.reason and maint.failed_compactions(api, agent) == 1
        second = run()  # the second failure resets
        assert (second.action, second.count_after) == ("reset", 1) and "2 failures reached 2" in second.reason
        assert maint.failed_compactions(api, agent) == 0
    finally:
        letta_server.llm.fail_summaries = False

    # failures left from earlier runs: straight to reset at warn
    _fill(crew, api, agent, 12)
    maint.set_failed_compactions(api, agent, 2)
    assert (run().action, maint.failed_compactions(api, agent)) == ("reset", 0)

    before = _fill(crew, api, agent, 20)
    critical = run()
    assert (critical.action, critical.level, critical.count_before, critical.count_after) == ("reset", "critical", before, 1)

    before = _fill(crew, api, agent, 26)
    emergency = run()
    assert (emergency.action, emergency.level, emergency.count_after) == ("reset", "emergency", 1)

    # the whole pass: every primary agent and companion, one logged Action each
    caplog.set_level("DEBUG", logger="mas.agents.letta.maintenance")
    actions = maint.maintain(settings)
    crew = backend.crew_conversations(settings)
    assert {a.agent for a in actions} == set(crew) | {f"{c}_sleeptime" for c in crew}
    # (a companion may finish a background run between the two counts; a primary agent may not)
    assert all(a.count_after <= a.count_before for a in actions if a.agent in crew)
    assert all(f"maintain {a.agent}: {a.action}" in caplog.text for a in actions)


def test_maintenance_refuses_to_run_against_a_server_that_is_down(down_settings):
    with pytest.raises(backend.LettaUnavailable, match="unavailable"):
        maint.maintain(down_settings)


# --- a vanished agent ------------------------------------------------------------------------------------


def _letta_env(studio_env: dict[str, str], server: LettaServer) -> dict[str, str]:
    return {
        **os.environ, **studio_env, "PYTHONPATH": str(ROOT), "MAS_AGENT_BACKEND": "letta",
        "MAS_LETTA_URL": server.url, "MAS_LETTA_TOKEN": server.token, "MAS_LETTA_MODEL": MODEL,
        "MAS_LETTA_EMBEDDING": EMBEDDING, "MAS_AGENT_CONVERSATIONS": str(LETTA_CONVERSATIONS),
    }


def test_a_deleted_agent_is_provisioned_again_once_even_by_racing_processes(
    letta_settings, letta_server, studio_env, api, provisioned
):
    crew = backend.letta_agents(letta_settings, STUDIO)
    crew.cameraman.review(ReviewBrief(grade="A", scores={}, min_grade="B", attempt=1, max_retries=3))  # ids now cached
    blocks = backend.find(letta_settings, STUDIO).blocks
    api.agents.delete(provisioned.agents["cameraman"].id)

    # three processes provision at once (say three workers starting): the advisory lock lets one create
    code = (
        "import json; from mas import db; from mas.config import Settings; from mas.agents import letta; "
        "from mas.domain.identity import STUDIO; "
        "s = Settings(); db.find(s); print(json.dumps(letta.provision(s, STUDIO).created))"
    )
    racers = [
        subprocess.Popen([sys.executable, "-c", code], env=_letta_env(studio_env, letta_server), cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    results = [r.communicate(timeout=120) for r in racers]
    assert all(r.returncode == 0 for r in racers), [err[-2000:] for _, err in results]
    assert sorted(json.loads(out.strip().splitlines()[-1]) for out, _ in results) == [[], [], ["agent cameraman"]]
    assert [a.name for a in api.agents.list(name="cameraman", tags=["mas"])] == ["cameraman"]

    # this process still holds the old id: its next call finds the new agent and carries on
    assert crew.cameraman.review(ReviewBrief(grade="A", scores={}, min_grade="B", attempt=1, max_retries=3)).action == "accept"
    again = backend.provision(letta_settings, STUDIO)
    assert again.created == [] and again.changed == []
    assert again.agents["cameraman"].id != provisioned.agents["cameraman"].id
    assert again.blocks == blocks  # the same shared blocks, attached to the new agent too


# --- end to end ----------------------------------------------------------------------------------------


@pytest.mark.usefixtures("provisioned")
def test_a_batch_runs_end_to_end_on_the_letta_backend(letta_settings, letta_server, tmp_path):
    """Real workers in an isolated studio whose agent backend is this Letta server."""
    from mas import agents

    try:
        agents.backend(letta_settings, STUDIO)
    except NotImplementedError:
        _unavailable("mas.agents.backend does not dispatch MAS_AGENT_BACKEND=letta yet")
    try:
        from tests.studio import IsolatedStudio
    except ImportError:
        _unavailable("tests/studio.py (the isolated studio) is not available")
    from mas.models import VideoState

    env = {
        "MAS_AGENT_BACKEND": "letta", "MAS_LETTA_URL": letta_server.url, "MAS_LETTA_TOKEN": letta_server.token,
        "MAS_LETTA_MODEL": MODEL, "MAS_LETTA_EMBEDDING": EMBEDDING, "MAS_AGENT_CONVERSATIONS": str(LETTA_CONVERSATIONS),
    }
    import tasks.pipeline  # noqa: F401  (registers the tasks)
    from mas.runtime.app import app_for

    app = app_for(letta_settings)
    # where the agent tasks retry transient agent failures, the first two replies are unparseable
    retried = all(
        issubclass(backend.LettaReplyError, tuple(app.tasks[f"tasks.pipeline.{name}"].autoretry_for or ()))
        for name in ("plan_batch", "write_prompt", "review")
    )
    llm = letta_server.llm
    def answered(task: str) -> int:  # role calls the stand-in answered with JSON
        return llm.count("role", task=task, garbage=False)

    before = {task: answered(task) for task in ("plan", "write", "review")}
    garbage_before = llm.count("role", garbage=True)
    garbage = 2 if retried else 0
    llm.garbage_replies = garbage
    with IsolatedStudio(tmp_path / "studio", **env) as studio:
        studio.worker("cpu", concurrency=2)
        studio.worker("gpu")
        batch_id = studio.enqueue("Create 2 videos of mythical creatures")
        studio.wait_batch(batch_id, timeout=240)
        videos = studio.videos(batch_id)
        logs = "".join(w.log.read_text() for w in studio.workers)
    assert len(videos) == 2 and all(v.state in (VideoState.accepted, VideoState.failed) for v in videos)
    assert not any("failed:" in reason for v in videos for reason in (v.failure_reasons or []))
    calls = {task: answered(task) - before[task] for task in before}
    attempts = sum(v.attempt_count for v in videos)
    assert calls == {"plan": 1, "write": attempts, "review": attempts}
    assert llm.count("role", garbage=True) - garbage_before == garbage and llm.garbage_replies == 0
    if retried:
        assert "LettaReplyError" in logs and "Retry in" in logs


@pytest.mark.usefixtures("provisioned")
def test_an_agent_that_keeps_answering_garbage_fails_its_batch_with_the_reason(letta_server, tmp_path):
    """Planning whose replies stay unreadable after its retries: the batch ends `failed` with the reason,
    `mas enqueue --wait` exits non-zero saying so in bounded time, and reconcile does not plan it again."""
    from tests.studio import IsolatedStudio

    env = {
        "MAS_AGENT_BACKEND": "letta", "MAS_LETTA_URL": letta_server.url, "MAS_LETTA_TOKEN": letta_server.token,
        "MAS_LETTA_MODEL": MODEL, "MAS_LETTA_EMBEDDING": EMBEDDING,
        "MAS_AGENT_RETRIES": "1", "MAS_AGENT_RETRY_BACKOFF_MAX_SECONDS": "1", "MAS_RECONCILE_AFTER_SECONDS": "1",
    }
    llm = letta_server.llm
    llm.garbage_replies = 10_000
    try:
        with IsolatedStudio(tmp_path / "studio", **env) as studio:
            studio.worker("cpu")
            started = time.monotonic()
            result = studio.mas("enqueue", "--wait", "Create 2 videos of dragons", timeout=180)
            assert time.monotonic() - started < 150
            assert result.returncode == 1, result.stdout + result.stderr
            assert "failed: planning failed: LettaReplyError" in result.stderr and "Traceback" not in result.stderr
            batch_id = int(result.stdout.split()[1].rstrip(":"))
            plans = llm.count("role", task="plan")
            recovered = studio.mas("recover")
            assert recovered.returncode == 0 and "re-planned 0 batch" in recovered.stdout, recovered.stdout
            studio.wait_quiet()
            with db.session_scope(studio.settings) as s:
                batch = s.get(Batch, batch_id)
                assert batch.status == BatchStatus.failed and "LettaReplyError" in batch.failure_reason
            assert llm.count("role", task="plan") == plans and studio.videos(batch_id) == []
    finally:
        llm.garbage_replies = 0


# --- one crew per user ---------------------------------------------------------------------------------


@pytest.mark.usefixtures("provisioned")
def test_each_user_has_their_own_agents_and_taste_blocks_and_shares_the_studios(letta_settings, letta_server, api):
    """A named user's calls go to their own agents, whose core memory shows that user's taste blocks and the
    studio's shared ones; the default crew and every other user's are untouched, and maintenance walks all."""
    from mas.memory.blocks import PER_USER

    alice, bob = Actor("alice"), Actor("bob")
    studio_blocks.update(letta_settings, alice, "user_style", {"COLOR_PREFERENCES": "deep purple"}, by="user")
    studio_blocks.update(letta_settings, bob, "user_style", {"COLOR_PREFERENCES": "burnt orange"}, by="user")
    llm = letta_server.llm
    seen = {}
    for name, user in (("alice", alice), ("bob", bob)):
        before = len(llm.find("role", task="review"))
        backend.letta_agents(letta_settings, user).cameraman.review(ReviewBrief(grade="A", scores={}, min_grade="B", attempt=1, max_retries=3))
        seen[name] = json.loads(llm.find("role", task="review")[before]["user_style"])["COLOR_PREFERENCES"]
    assert seen == {"alice": "deep purple", "bob": "burnt orange"}  # what each one's cameraman was shown

    studio = backend.find(letta_settings, STUDIO)  # the default user's crew, as earlier tests left it
    crews = {"alice": backend.find(letta_settings, alice), "bob": backend.find(letta_settings, bob)}
    for name, crew in crews.items():
        for role, ids in crew.agents.items():
            agent = api.agents.retrieve(ids.id, include=["agent.blocks", "agent.tags"])
            assert agent.name == f"{role.replace('.', '_')}-{name}" and f"mas:user:{name}" in (agent.tags or [])
            assert ids.id != studio.agents[role].id
            assert {b.label: b.id for b in agent.blocks if b.label in SCHEMAS} == crew.blocks
        for label in SCHEMAS:
            shared = crew.blocks[label] == studio.blocks[label]
            assert shared == (label not in PER_USER), label
    assert crews["alice"].blocks["user_style"] != crews["bob"].blocks["user_style"]
    assert backend.LettaBlockStore(letta_settings, alice).read("user_style")["COLOR_PREFERENCES"] == "deep purple"
    assert backend.LettaBlockStore(letta_settings, bob).read("user_style")["COLOR_PREFERENCES"] == "burnt orange"

    # the default crew still finds its own blocks (not a user's), and provisioning it again makes nothing
    again = backend.provision(letta_settings, STUDIO)
    assert again.created == [] and again.blocks == studio.blocks
    assert backend.LettaBlockStore(letta_settings, STUDIO).read("user_style")["COLOR_PREFERENCES"] not in seen.values()
    assert backend.provision(letta_settings, alice).created == []

    primaries, companions = maint.targets(api)
    crew = backend.crew_conversations(letta_settings)
    assert {f"{c}{u}" for c in crew for u in ("", "@alice", "@bob")} <= set(primaries)
    assert "director@alice_sleeptime" in companions and "director_sleeptime" in companions
