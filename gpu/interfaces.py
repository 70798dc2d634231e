"""What the gpu tasks expect of a video backend and of a grader; no implementation lives here.

A backend turns one prompt into one mp4 at a path the studio chooses. `progress(done, total)` is called
as the render advances, so the Celery task can report it. A grader scores one rendered mp4 against its
prompt (and the video's concept, for the preference axis) and grades it by `mas.grading`'s table.
`gpu.factory` picks the implementations from settings.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

Progress = Callable[[int, int], None]


class VideoBackend(Protocol):
    name: str

    def __call__(
        self, *, prompt: str, negative_prompt: str, seed: int, output: Path, progress: Progress | None = None
    ) -> Path: ...


class Grader(Protocol):
    name: str

    def __call__(self, *, video: Path, prompt: str, concept: str = "") -> tuple[dict[str, float], str]: ...
