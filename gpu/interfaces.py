"""What the gpu tasks expect of a video backend and of a grader; no implementation lives here (beyond
`check_stop`, the one way a backend answers a stop request).

A backend turns one prompt into one mp4 at a path the studio chooses. `progress(done, total)` is called
as the render advances, so the Celery task can report it. A grader scores one rendered mp4 against its
prompt (and the video's concept, for the preference axis) and grades it by `mas.gpu_rules.grading`'s table.
`gpu.factory` picks the implementations from settings.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from mas.domain.identity import Actor
from mas.errors import PermanentError

Progress = Callable[[int, int], None]

STOP_POLL_SECONDS = 0.5
"""The longest a backend goes without asking `should_stop()` while it renders."""


class RenderStopped(PermanentError):
    """The render was stopped on request (its video was cancelled); nothing to retry."""


def check_stop(should_stop: Callable[[], bool] | None, what: str) -> None:
    """Raise `RenderStopped` if the caller has asked the render (`what`) to stop."""
    if should_stop is not None and should_stop():
        raise RenderStopped(f"{what} was stopped on request")


class VideoBackend(Protocol):
    """Renders one attempt of one video into `output`.

    `render_id` names the attempt's render and stays the same when the attempt is rendered again after a
    crash, so a backend with a render server finds the render it already started instead of starting
    another. `output` is unique per run: the backend writes the mp4 there and nothing else (a failed render
    leaves no file at `output`). `should_stop()` is polled while the render runs (at every progress step
    and at least every STOP_POLL_SECONDS); when it answers True the backend stops the render and raises
    `RenderStopped`. `order` ranks the render in a render server's queue (lower runs first); a backend
    that renders in this process ignores it.
    """

    # read-only here: the implementations are frozen dataclasses or set these themselves

    @property
    def name(self) -> str: ...

    @property
    def uses_this_gpu(self) -> bool:
        """True when the render runs in this process on its GPU (the task takes a GPU turn for it); False when
        a render server owns the GPU and queues renders itself (the task only waits on it)."""
        ...

    @property
    def last_run_seconds(self) -> float | None:
        """How long the last render ran, by the render server's own record (None: the caller's clock is right,
        the render ran in this process from call to return). A queued render waits before it runs."""
        ...

    def __call__(
        self,
        *,
        prompt: str,
        negative_prompt: str,
        seed: int,
        output: Path,
        render_id: str,
        progress: Progress | None = None,
        should_stop: Callable[[], bool] | None = None,
        order: float | None = None,
    ) -> Path: ...


class Grader(Protocol):
    @property
    def name(self) -> str: ...

    def __call__(self, *, video: Path, prompt: str, actor: Actor, concept: str = "") -> tuple[dict[str, float], str]:
        """(scores, grade); `actor` is whose taste the preference axis measures."""
