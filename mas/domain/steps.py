"""The pipeline's steps, declared once: each step's name, task, queue, the state it runs in and where it leads.

A video's live state names the step that is due (or running) for its current attempt, so a state, a step and
a lease are one name: `writing` -> write, `rendering` -> render, `grading` -> grade, `reviewing` -> review.
Every step runs through one mechanism (`mas.pipeline.runner`): claim the lease, check the video is where the
step expects it, do the work with no transaction open, record the result and move the video on. A step
declares here how it is tried again (its `RetryPolicy`, the one its task reads) and how long one try may take. Adding a stage is one entry here,
its state in `VideoState`, and one body registered with `mas.pipeline.runner.step_task` (ARCHITECTURE.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mas import names
from mas.domain.states import TERMINAL, VideoState
from mas.errors import InvalidInput, PermanentError, RetryableError

if TYPE_CHECKING:
    from mas.config import Settings

S = VideoState


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How a failed try is tried again: the one policy a task reads (`mas.runtime.app.StudioTask`). A database
    that is away is waited out by every task whatever its policy, never spent from these retries."""

    times: Callable[[Settings], int]
    """How often a failed try is tried again."""
    backoff: int
    """The bound of the first wait between two tries, in seconds: it doubles with each try up to `backoff_max`,
    and each wait is drawn at random below it (jitter)."""
    backoff_max: Callable[[Settings], int]
    """The longest wait between two tries, in seconds."""
    any_error: bool
    """True: any error but a permanent one is tried again (a render that crashed, hung past its soft time limit
    or answered garbage); False: only an error that says trying again can help (`RetryableError`)."""
    waits_for_peers: bool = False
    """Whether a server it needs that is away (`PeerUnavailable`: an LLM, Letta) is waited for, every
    MAS_AGENT_RETRY_BACKOFF_MAX_SECONDS for up to MAS_PEER_WAIT_SECONDS, without spending `times`."""

    def tries_again(self, error: Exception) -> bool:
        """Whether `error` is worth another try (a permanent error never is)."""
        return not isinstance(error, PermanentError) and (self.any_error or isinstance(error, RetryableError))


ASKS_AN_AGENT = RetryPolicy(
    times=lambda settings: settings.agents.retries,
    backoff=2,
    backoff_max=lambda settings: settings.agents.retry_backoff_max_seconds,
    any_error=False,
    waits_for_peers=True,
)
"""A step (or a task) that asks an agent: a reply that cannot be used yet is asked again, a server that is away
is waited for."""

ON_THE_GPU = RetryPolicy(
    times=lambda settings: settings.gpu.step_retries, backoff=1, backoff_max=lambda _: 60, any_error=True
)
"""A step of the gpu worker: a generator or grader that fails, hangs or answers garbage is tried a few times,
then the video is skipped with the reason; a permanent error (a missing model, a refused workflow) at once."""


@dataclass(frozen=True, kw_only=True)
class Step:
    """One step of an attempt."""

    name: str
    """What leases, logs and people call it."""
    task: str
    """The registered Celery task that runs it, in a package of `mas.names.TASK_PACKAGES`; a registered name
    never changes (queued messages carry it)."""
    queue: str
    """The queue its task goes to (high-priority work goes to that queue's urgent twin)."""
    state: VideoState
    """The video's state while this step is due or running."""
    leads_to: tuple[VideoState, ...]
    """The states its success may move the video to (first: the usual one, `next_state`)."""
    work: str
    """What it does, for people."""
    retry: RetryPolicy
    """How a failed try is tried again: how often, after how long, and which errors."""
    time_limit: Callable[[Settings], float] | None = None
    """How long one try may run before it is killed (a soft limit a little earlier lets it clean up); None:
    its calls bound themselves (an agent's request has its own timeout)."""
    on_gpu: bool = False
    """Whether it runs on the gpu worker (pacing counts the steps up to the first one that does)."""
    finishes: bool = False
    """Whether it finishes what an earlier step started (a grading, a review): taken before new work."""

    @property
    def next_state(self) -> VideoState:
        """Where its success usually leads: the next step's state (a body returns it, so inserting a step after
        this one changes only the table)."""
        return self.leads_to[0]


STEPS: tuple[Step, ...] = (
    Step(
        name="write",
        task="tasks.pipeline.write_prompt",
        queue=names.CPU_QUEUE,
        state=S.writing,
        leads_to=(S.rendering,),
        work="the Writer writes the attempt's prompt from the concept, the user's style and past outcomes",
        retry=ASKS_AN_AGENT,
    ),
    Step(
        name="render",
        task="gpu.tasks.generate_video",
        queue=names.GPU_QUEUE,
        state=S.rendering,
        leads_to=(S.grading,),
        work="the video backend renders the prompt to an mp4",
        retry=ON_THE_GPU,
        time_limit=lambda settings: settings.gpu.max_render_seconds,
        on_gpu=True,
    ),
    Step(
        name="grade",
        task="gpu.tasks.evaluate_video",
        queue=names.GRADE_QUEUE,
        state=S.grading,
        leads_to=(S.reviewing,),
        work="the grader scores the render per axis and grades it",
        retry=ON_THE_GPU,
        time_limit=lambda settings: settings.gpu.max_render_seconds,
        on_gpu=True,
        finishes=True,
    ),
    Step(
        name="review",
        task="tasks.pipeline.review",
        queue=names.CPU_QUEUE,
        state=S.reviewing,
        leads_to=(S.accepted, S.writing, S.failed),
        work="the Cameraman accepts the attempt, refines it (the next attempt's write) or gives the video up",
        retry=ASKS_AN_AGENT,
        finishes=True,
    ),
)
"""In the order an attempt runs them."""

FIRST = STEPS[0]
BY_NAME: dict[str, Step] = {step.name: step for step in STEPS}
BY_STATE: dict[VideoState, Step] = {step.state: step for step in STEPS}
BY_TASK: dict[str, Step] = {step.task: step for step in STEPS}


STEP_STATES = frozenset(BY_STATE)
"""Live states whose step is due or running (not `waiting`, whose write is not due yet, nor a final state)."""

AHEAD_OF_THE_GPU = frozenset(step.state for step in STEPS[: next(i for i, s in enumerate(STEPS) if s.on_gpu) + 1])
"""The states of a video on its way to the GPU: its steps up to and including the first gpu step (a render).
Pacing counts these against MAS_WRITE_AHEAD (`mas.pipeline.pacing`)."""

ALLOWED: dict[VideoState, frozenset[VideoState]] = {
    **{step.state: frozenset({*step.leads_to, S.failed, S.cancelled}) for step in STEPS},
    **{state: frozenset() for state in TERMINAL},
    S.waiting: frozenset({S.writing, S.failed, S.cancelled}),
}
"""The state machine: a live state goes where its step's success leads, or ends failed or cancelled; a final
state goes nowhere."""


def after(step: Step) -> tuple[Step, ...]:
    """The steps that follow `step` in the same attempt."""
    return STEPS[STEPS.index(step) + 1 :]


def order(state: VideoState) -> int:
    """Where a live state comes in an attempt (0 for writing; -1 for waiting, before any step)."""
    return STEPS.index(BY_STATE[state]) if state in BY_STATE else -1


FINISH = 0
"""Message priority of work that finishes what is started (the Redis transport takes lower numbers first)."""
REFINE = 3
"""Message priority of a refinement's write and render: an attempt of a video already under way."""
NEW = 6
"""Message priority of new work: a video's first write and render, and the studio's own jobs (beat's, a
consolidation: `task_default_priority`), so no steady stream of them can hold a batch back."""
STARTS = FINISH
"""Message priority of a plan or a resume: one short task that sets a whole batch going."""


def message_priority(step: Step, attempt: int, *, grouped: bool) -> int:
    """Where a step's message waits in its queue: finish what is started, then refinements, then new videos.

    Gradings share the renders' queue unless `grouped` (MAS_GPU_GROUPING: the grader and the video model
    cannot both stay loaded), and then keep the renders' level so the gpu worker stays with one kind of
    work while it has any (`mas.runtime.queue_order`); otherwise a grading comes right after its render.
    """
    if step.finishes and not (grouped and step.on_gpu):
        return FINISH
    return REFINE if attempt > 1 else NEW


@dataclass(frozen=True, kw_only=True)
class StepPayload:
    """What every step's message carries: which attempt of which video. The database holds the rest."""

    video_id: int
    attempt: int

    def to_json(self) -> dict[str, int]:
        return {"video_id": self.video_id, "attempt": self.attempt}

    @classmethod
    def from_json(cls, value: Any) -> StepPayload:
        if not isinstance(value, dict) or not all(isinstance(value.get(k), int) for k in ("video_id", "attempt")):
            raise InvalidInput(f"a step's payload names a video_id and an attempt, got {value!r}"[:300])
        return cls(video_id=value["video_id"], attempt=value["attempt"])

    @classmethod
    def of_message(cls, args: Any, kwargs: Any) -> StepPayload | None:
        """The payload of a step task's message (positional or keyword), or None when it carries none."""
        value = args[0] if args else (kwargs or {}).get("payload")
        try:
            return cls.from_json(value)
        except InvalidInput:
            return None
