"""The one way a pipeline step runs: lease, guard, work outside any transaction, record, move on.

Every step of `mas.domain.steps.STEPS` is a `StepBody` registered with `step_task`. The runner

1. claims the step's lease for (video, attempt, step) (`mas.pipeline.leases`): a second delivery of a running step
   leaves it alone; a step whose worker keeps dying is given up;
2. in a short transaction with the video row locked, checks the video is where the step expects it (its
   state is the step's state at the payload's attempt, its batch running) and lets the body read what its
   work needs (`prepare`);
3. runs the body's `work` (an agent's call, a render, a grading) with no transaction open;
4. in a second short transaction, checks again (the video may have been cancelled meanwhile), lets the body
   write its result (`record`) and moves the video to the state the body chose, in the same commit; a final
   state is the video's end, handed to its listeners there too (`mas.pipeline.ending`); a database that is
   away (a failover) is waited out here for MAS_DATABASE_WAIT_SECONDS, the lease still held, so work done is
   not done again;
5. after the commit, runs what the outcome asks for (send the next attempt) and what the move left to send
   (the videos let through to writing, a consolidation when due).

A duplicate message finds the video further along at the same attempt and passes the payload on (the first
delivery died after its commit, before its chain sent the next message); anything else (an older attempt, a
final video, a paused or cancelled batch) ends the chain quietly (Celery's `Ignore`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import sqlalchemy as sa
from celery import Task, shared_task
from celery.exceptions import Ignore
from sqlalchemy.orm import Session

from mas import names
from mas.config import Settings
from mas.db import session_scope
from mas.domain.identity import Actor
from mas.domain.states import TERMINAL
from mas.domain.steps import BY_STATE, Step, StepPayload, order
from mas.models import Video, VideoState
from mas.names import Priority
from mas.pipeline import ending, leases, pacing, states
from mas.pipeline.chains import send_released
from mas.pipeline.ending import Ending
from mas.pipeline.leases import Lease
from mas.pipeline.outcomes import fail_on_error
from mas.runtime import failover
from mas.runtime.app import StepTask

log = logging.getLogger(__name__)

Inputs = TypeVar("Inputs")
Result = TypeVar("Result")


@dataclass(frozen=True, kw_only=True)
class StepRun:
    """What a step's body knows of the run it is part of."""

    step: Step
    payload: StepPayload
    settings: Settings
    actor: Actor
    """The user the video's batch is made for (whose taste and style the step reads and writes)."""
    lease: Lease
    priority: Priority
    task: Task

    @property
    def video_id(self) -> int:
        return self.payload.video_id

    @property
    def attempt(self) -> int:
        return self.payload.attempt

    def describe(self) -> str:
        return describe(self.step, self.payload)


@dataclass(kw_only=True)
class Outcome:
    """What a step's `record` decided: where the video goes, what is written with the move, what follows."""

    state: VideoState
    values: dict[str, Any] = field(default_factory=dict)
    """Video columns written in the same UPDATE as the move (a grade, an output path)."""
    then: Callable[[], None] | None = None
    """Run after the commit: what must follow (send the next attempt's chain)."""
    remember: Callable[[], None] | None = None
    """Run after `then`: bookkeeping (a line in the agent's recall buffer) whose failure is logged and fails
    nothing."""


class StepBody(Protocol, Generic[Inputs, Result]):
    """The part of a step that is its own; the runner does the rest."""

    def prepare(self, run: StepRun, session: Session, video: Video) -> Inputs:
        """Read what the work needs (the video row is locked; keep it short)."""

    def work(self, run: StepRun, inputs: Inputs) -> Result:
        """The step's work, with no transaction open (an agent's call, a render, a grading)."""

    def record(self, run: StepRun, session: Session, video: Video, result: Result) -> Outcome:
        """Write the result and say where the video goes (the row is locked; it moves in this commit)."""


def step_task(step: Step, body: StepBody[Any, Any]) -> Task:
    """Register the Celery task that runs `step` with `body` (its retries and time limit: the step's own,
    `mas.runtime.app.StepTask`)."""

    def run(self: Task, payload: dict[str, int]) -> dict[str, int]:
        return run_step(self, step, StepPayload.from_json(payload), body)

    run.__name__ = run.__qualname__ = step.task.rsplit(".", 1)[-1]
    run.__module__ = type(body).__module__
    run.__doc__ = f"The {step.name} step: {step.work}."
    return shared_task(name=step.task, bind=True, base=StepTask, on_failure=fail_on_error, step=step)(run)


def run_step(task: Task, step: Step, payload: StepPayload, body: StepBody[Any, Any]) -> dict[str, int]:
    """Run one delivery of `step` for `payload` (see the module's docstring); returns the payload for the
    chain's next step."""
    settings: Settings = task.app.settings
    try:
        return _run_held(task, step, payload, body)
    except leases.LeaseHeld as held:
        # its own earlier try's lease, perhaps: once it has expired, the step is taken over (or found done)
        raise task.retry(exc=held, countdown=settings.reliability.lease_expiry_seconds + 1) from held


def _run_held(task: Task, step: Step, payload: StepPayload, body: StepBody[Any, Any]) -> dict[str, int]:
    settings: Settings = task.app.settings
    retrying = bool(task.request.retries)
    with leases.hold_step(
        settings,
        video_id=payload.video_id,
        attempt=payload.attempt,
        step=step.name,
        worker=task.request.hostname,
        retrying=retrying,
    ) as lease:
        with session_scope(settings) as session:
            video = _locked(session, payload.video_id)
            if _done_before(step, video, payload):
                return payload.to_json()
            if video is None or not _due(step, video, payload) or not states.steps_may_run(session, video.id):
                raise Ignore()
            leases.check_claims(settings, lease)
            run = StepRun(
                step=step,
                payload=payload,
                settings=settings,
                actor=Actor(video.batch.user_name),
                lease=lease,
                priority=priority_of(task),
                task=task,
            )
            inputs = body.prepare(run, session, video)
        result = body.work(run, inputs)
        recorded = failover.waited_out(
            lambda: _record(settings, run, body, result),
            seconds=settings.reliability.database_wait_seconds,
            waiting=lambda exc, left: log.warning(
                "%s waits %.0f s more for the database to record its result: %s", run.describe(), left, exc
            ),
        )
        if recorded is None:
            return payload.to_json()
        outcome, moved = recorded
    log.info("%s recorded", run.describe())  # committed: its result is the studio's (a failover test counts these)
    if outcome.then is not None:
        outcome.then()
    if outcome.remember is not None:
        try:
            outcome.remember()
        except Exception as exc:  # the video has moved on; a missing recall line is not worth failing it for
            log.warning("%s: recall not written: %s", describe(step, payload), exc)
    moved.run(task.app)  # after the recall line, which a consolidation it sends reads
    return payload.to_json()


def _record(settings: Settings, run: StepRun, body: StepBody[Any, Any], result: Any) -> tuple[Outcome, Ending] | None:
    """Write the work's result and move the video, in one transaction; tried again while the database is away,
    so work done (a render) is not thrown away for a blink. None: found recorded (a commit whose answer the
    connection lost); `Ignore` when the video moved on (cancelled or failed)."""
    with session_scope(settings) as session:
        video = _locked(session, run.video_id)
        if _done_before(run.step, video, run.payload):
            return None
        if video is None or not _due(run.step, video, run.payload):
            log.info("%s: the video moved on meanwhile (cancelled or failed); nothing recorded", run.describe())
            raise Ignore()
        outcome = body.record(run, session, video, result)
        moved = _move(run, session, outcome)
        if moved is None:
            raise Ignore()
        return outcome, moved


def _move(run: StepRun, session: Session, outcome: Outcome) -> Ending | None:
    """Move the video where the step's outcome leads: to its next step (freeing its place ahead of the GPUs
    when it leaves one) or to its end (`mas.pipeline.ending`); None when it had moved on."""
    source, payload = run.step.state, run.payload
    if outcome.state in TERMINAL:
        return ending.end(
            run.settings, session, payload.video_id, source, outcome.state, attempt=payload.attempt, **outcome.values
        )
    if not states.transition(
        session, payload.video_id, source, outcome.state, attempt=payload.attempt, **outcome.values
    ):
        return None
    if not pacing.leaves_ahead(source, outcome.state):
        return Ending()
    released = pacing.release(run.settings, session)
    return Ending([lambda app: send_released(app, released)])


def describe(step: Step, payload: StepPayload) -> str:
    """How logs name one run of a step."""
    return f"{step.name} of video {payload.video_id} attempt {payload.attempt}"


def _locked(session: Session, video_id: int) -> Video | None:
    return session.execute(sa.select(Video).where(Video.id == video_id).with_for_update()).scalar_one_or_none()


def _due(step: Step, video: Video | None, payload: StepPayload) -> bool:
    return video is not None and video.state == step.state and video.attempt_count == payload.attempt


def _done_before(step: Step, video: Video | None, payload: StepPayload) -> bool:
    """The video is further along in the same attempt: this step's work is committed."""
    return (
        video is not None
        and video.attempt_count == payload.attempt
        and video.state not in TERMINAL
        and order(video.state) > order(step.state)
    )


def priority_of(task: Task) -> Priority:
    """high when the task came from an urgent queue."""
    queue = (task.request.delivery_info or {}).get("routing_key") or ""
    return "high" if names.is_urgent(queue) else "normal"


def resume_point(video: Video) -> tuple[Step, StepPayload]:
    """Where an unfinished video's work goes on: the step its state names, for its current attempt."""
    return BY_STATE[video.state], StepPayload(video_id=video.id, attempt=video.attempt_count)
