"""The step table (`mas.domain.steps`) agrees with everything named after it: the states enum, the task names and
their packages, the Celery routes and task options, pacing, and the state machine derived from it. A new step
that misses one of these fails here. Pure code: no server."""

from __future__ import annotations

import importlib

import pytest

from mas import names
from mas.config import Settings
from mas.domain.states import TERMINAL, BatchStatus, VideoState
from mas.domain.steps import (
    AHEAD_OF_THE_GPU,
    ALLOWED,
    ASKS_AN_AGENT,
    BY_NAME,
    BY_STATE,
    FINISH,
    NEW,
    ON_THE_GPU,
    REFINE,
    STEP_STATES,
    STEPS,
    StepPayload,
    after,
    message_priority,
    order,
)
from mas.errors import InvalidInput, PeerUnavailable, PermanentError, RetryableError
from mas.pipeline import pacing
from mas.runtime.app import AgentTask, StepTask, Studio, celery_config
from mas.runtime.failover import DatabaseAway

S = VideoState


@pytest.fixture
def config(tmp_path, monkeypatch):
    monkeypatch.setenv("MAS_DATA_DIR", str(tmp_path))
    return lambda **values: celery_config(Settings(**values))


def test_the_enum_and_the_table_name_the_same_steps():
    assert [step.state for step in STEPS] == [S.writing, S.rendering, S.grading, S.reviewing]
    assert set(VideoState) == {S.waiting, *STEP_STATES, *TERMINAL}
    for unique in ("name", "task", "state"):
        assert len({getattr(step, unique) for step in STEPS}) == len(STEPS), unique
    assert all(len(state.value) <= 32 for state in VideoState)  # the column holds 32 characters


@pytest.mark.parametrize("step", STEPS, ids=lambda step: step.name)
def test_each_steps_task_is_in_a_registered_package_and_named_by_nothing_else(step):
    assert step.task not in vars(names).values()  # the table is the one place a step's task is named
    package = step.task.rsplit(".", 1)[0]
    assert package in names.TASK_PACKAGES
    assert importlib.util.find_spec(package) is not None


@pytest.mark.parametrize("grouped", [True, False])
def test_the_routes_send_each_step_to_its_queue(config, grouped):
    routes = config(gpu_grouping=grouped)["task_routes"]
    for step in STEPS:
        expected = names.GPU_QUEUE if step.queue == names.GRADE_QUEUE and not grouped else step.queue
        assert routes[step.task] == {"queue": expected}, step.name


@pytest.mark.parametrize("state", list(VideoState), ids=lambda state: state.value)
def test_the_state_machine_has_every_state_and_every_live_one_can_end(state):
    targets = ALLOWED[state]
    if state in TERMINAL:
        assert targets == frozenset()
    else:
        assert {S.failed, S.cancelled} <= targets
        assert all(t in ALLOWED for t in targets)


@pytest.mark.parametrize("step", STEPS, ids=lambda step: step.name)
def test_a_step_leads_where_the_machine_allows_and_to_a_later_state_or_an_end(step):
    assert set(step.leads_to) <= ALLOWED[step.state]
    usual = step.leads_to[0]
    assert usual in TERMINAL or order(usual) > order(step.state)
    assert BY_STATE[step.state] is step


def test_after_and_order_follow_the_table():
    assert [s.name for s in after(STEPS[0])] == ["render", "grade", "review"]
    assert after(STEPS[-1]) == ()
    assert order(S.waiting) == -1 and [order(step.state) for step in STEPS] == [0, 1, 2, 3]


@pytest.mark.parametrize("step", STEPS, ids=lambda step: step.name)
def test_a_steps_task_takes_the_retries_and_time_limit_its_entry_declares(tmp_path, monkeypatch, step):
    monkeypatch.setenv("MAS_DATA_DIR", str(tmp_path))
    settings = Settings(agent_retries=7, step_retries=4, max_render_seconds=1000, visibility_timeout_seconds=9000)
    task = StepTask()
    task.bind(Studio(settings))
    task.step = step
    assert task.retry_policy is step.retry is (ON_THE_GPU if step.on_gpu else ASKS_AN_AGENT)
    assert task.max_retries == step.retry.times(settings) == (4 if step.on_gpu else 7)
    if step.time_limit is None:
        assert task.time_limit is None and task.soft_time_limit is None
    else:
        assert task.time_limit == step.time_limit(settings) == 1000 and task.soft_time_limit == 970


def test_pacing_counts_the_states_on_the_way_to_the_first_gpu_step():
    assert AHEAD_OF_THE_GPU == {S.writing, S.rendering} <= STEP_STATES
    assert pacing.leaves_ahead(S.rendering, S.grading) and not pacing.leaves_ahead(S.writing, S.rendering)
    assert pacing.first_state("high") == S.writing and pacing.first_state("normal") == S.waiting


@pytest.mark.parametrize(
    ("name", "attempt", "grouped", "expected"),
    [
        ("write", 1, False, NEW),
        ("write", 2, False, REFINE),
        ("render", 1, False, NEW),
        ("grade", 1, False, FINISH),
        ("grade", 1, True, NEW),  # grouped with the renders, it keeps their level
        ("review", 3, True, FINISH),
    ],
)
def test_finishing_comes_before_refining_before_new_work(name, attempt, grouped, expected):
    step = next(s for s in STEPS if s.name == name)
    assert message_priority(step, attempt, grouped=grouped) == expected
    assert FINISH < REFINE < NEW


@pytest.mark.parametrize(
    "message", [([{"video_id": 1, "attempt": 2}], {}), ((), {"payload": {"video_id": 1, "attempt": 2}})]
)
def test_a_payload_is_read_from_a_message_either_way(message):
    assert StepPayload.of_message(*message) == StepPayload(video_id=1, attempt=2)


@pytest.mark.parametrize("bad", [None, {}, {"video_id": "1", "attempt": 1}, [1, 2], {"video_id": 1}])
def test_a_payload_that_names_no_attempt_of_a_video_is_refused(bad):
    with pytest.raises(InvalidInput):
        StepPayload.from_json(bad)
    assert StepPayload.of_message([bad], {}) is None


def test_a_batch_ends_in_one_of_three_ways():
    assert {BatchStatus.done, BatchStatus.failed, BatchStatus.cancelled} < set(BatchStatus)


def _runs_of(tmp_path, monkeypatch, step_name: str, error: Exception, **values) -> list[int]:
    """Run a task of the step `step_name` whose every try fails with `error`, eagerly (each retry is one more
    run, at once): the retry number of each run."""
    monkeypatch.setenv("MAS_DATA_DIR", str(tmp_path))
    app = Studio(Settings(**values), set_as_current=False)
    runs: list[int] = []

    @app.task(bind=True, base=StepTask, step=BY_NAME[step_name], name=f"tests.failing_{step_name}")
    def failing(self, payload: dict) -> None:  # noqa: ARG001  # a step task takes its payload
        runs.append(self.request.retries)
        raise error

    result = failing.apply(args=[{"video_id": 1, "attempt": 1}])
    assert result.failed() and result.result is error
    return runs


AWAY = DatabaseAway("insert", {}, Exception("the server closed the connection"), connection_invalidated=True)


@pytest.mark.parametrize(
    ("step_name", "error", "runs"),
    [
        ("render", RuntimeError("the backend crashed"), 1 + 4),  # on the GPU any error is tried again
        ("render", PermanentError("no such model"), 1),
        ("render", PeerUnavailable("ComfyUI does not answer"), 1 + 4),  # a gpu step spends its own retries
        ("write", RetryableError("the reply did not validate"), 1 + 7),
        ("write", ValueError("a bug"), 1),  # off the GPU only what says trying again can help
        ("review", PermanentError("invalid settings"), 1),
        ("write", AWAY, 1 + StepTask.database_retries),  # waited out by every task, never from the step's retries
        ("grade", AWAY, 1 + StepTask.database_retries),
    ],
    ids=lambda value: value if isinstance(value, (str, int)) else type(value).__name__,
)
def test_a_step_is_tried_again_as_its_retry_policy_says(tmp_path, monkeypatch, step_name, error, runs):
    assert _runs_of(tmp_path, monkeypatch, step_name, error, agent_retries=7, step_retries=4) == list(range(runs))


def test_a_step_that_asks_an_agent_waits_for_a_server_that_is_away(tmp_path, monkeypatch):
    """Every MAS_AGENT_RETRY_BACKOFF_MAX_SECONDS for MAS_PEER_WAIT_SECONDS, whatever its own retries."""
    away = PeerUnavailable("the model server does not answer")
    values = {"agent_retries": 0, "peer_wait_seconds": 10, "agent_retry_backoff_max_seconds": 2}
    assert _runs_of(tmp_path, monkeypatch, "review", away, **values) == list(range(1 + 5))


def test_an_agent_task_outside_the_table_asks_again_as_an_agent_step_does():
    assert AgentTask.retry_policy is ASKS_AN_AGENT is BY_NAME["write"].retry
    assert ASKS_AN_AGENT.tries_again(RetryableError("x")) and not ASKS_AN_AGENT.tries_again(ValueError("x"))
    assert ON_THE_GPU.tries_again(ValueError("x")) and not ON_THE_GPU.tries_again(PermanentError("x"))
