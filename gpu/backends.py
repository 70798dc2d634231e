"""The video backend interface and the factory that picks one from settings.

A backend turns one prompt into one mp4 at a path the studio chooses. `progress(done, total)` is called
as the render advances, so the Celery task can report it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol

from mas.config import Settings

Progress = Callable[[int, int], None]


class VideoBackend(Protocol):
    name: str

    def __call__(
        self, *, prompt: str, negative_prompt: str, seed: int, output: Path, progress: Progress | None = None
    ) -> Path: ...


def video_backend(settings: Settings) -> VideoBackend:
    """The backend named by MAS_VIDEO_BACKEND."""
    if settings.video_backend == "preview":
        from gpu.preview import PreviewRenderer

        return PreviewRenderer(seconds=settings.preview_render_seconds)
    if settings.video_backend == "comfyui":
        from gpu.comfyui import ComfyUIBackend

        return ComfyUIBackend(settings=settings)
    if settings.video_backend == "diffusers":
        from gpu.diffusers_backend import DiffusersBackend
        from gpu.residency import residency

        return DiffusersBackend(settings=settings, residency=residency(settings))
    raise ValueError(f"unknown video backend {settings.video_backend!r}; use preview, comfyui or diffusers")
