"""What the gpu tasks are built from, picked by settings: the model residency, the video backend, the grader.

The one place that knows every implementation. A new backend is one module under `gpu/` and one branch in
`video_backend`. Implementations are imported when picked, so a worker loads torch and model libraries
only for the backend and grader it runs, and a process that merely imports the gpu task module (every
worker registers it) none at all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gpu.interfaces import Grader, VideoBackend
from mas.config import Settings
from mas.errors import InvalidSettings
from mas.singletons import per_process

if TYPE_CHECKING:
    from gpu.residency import Residency
    from gpu.turns import GpuTurns


@per_process(
    key=lambda settings: (
        settings.gpu.vram_budget_gb,
        settings.video.backend,
        settings.comfyui.url,
        settings.gpu.device,
    )
)
def residency(settings: Settings) -> Residency:
    """The process's model residency manager, made on first use.

    One per process, because the gpu worker runs every gpu task in this process (its threads take turns on
    the GPU, `gpu_turns`) and backends and graders are built per task: the models must outlive the task
    that loaded them. It is made lazily, so no CUDA state exists before a fork. A worker's settings do not
    change while it runs, so a worker has exactly one, on its own device (MAS_GPU_DEVICE).
    """
    from gpu.residency import Residency, budget_of, worker_device

    device = worker_device(settings.gpu.device)
    return Residency(budget_bytes=budget_of(settings, device), device=device, on_before_load=_before_load(settings))


@per_process(key=lambda settings: settings.scheduling.priority_head_start_seconds)
def gpu_turns(settings: Settings) -> GpuTurns:
    """The process's turns on its GPU: one holder at a time among the worker's threads."""
    from gpu.turns import GpuTurns

    return GpuTurns(head_start_seconds=settings.scheduling.priority_head_start_seconds)


def _before_load(settings: Settings) -> Callable[[str], None] | None:
    """When ComfyUI renders on this GPU, ask it to give memory back before a local model loads."""
    if settings.video.backend != "comfyui":
        return None
    from gpu.comfyui_client import ComfyUIClient

    client = ComfyUIClient(url=settings.comfyui.url, retries=settings.comfyui.retries)
    return lambda key: client.free(unload_models=True, free_memory=True)  # noqa: ARG005


def video_backend(settings: Settings) -> VideoBackend:
    """The backend named by MAS_VIDEO_BACKEND."""
    if settings.video.backend == "preview":
        from gpu.preview import PreviewRenderer

        return PreviewRenderer(seconds=settings.video.preview_render_seconds)
    if settings.video.backend == "comfyui":
        from gpu.comfyui import ComfyUIBackend

        return ComfyUIBackend(settings=settings)
    if settings.video.backend == "diffusers":
        from gpu.diffusers_backend import DiffusersBackend
        from gpu.residency import GIB
        from mas.gpu_rules.vram_plan import check_fits

        manager = residency(settings)
        if manager.budget_bytes is not None:  # the budget, or the card's memory: refused before anything loads
            check_fits(settings, budget_gb=manager.budget_bytes / GIB)
        return DiffusersBackend(settings=settings, residency=manager)
    raise InvalidSettings(
        f"unknown video backend {settings.video.backend!r}; set MAS_VIDEO_BACKEND to preview, comfyui or diffusers"
    )


def grader(settings: Settings) -> Grader:
    """The grader named by MAS_GRADER: the offline preview stand-in, or DQA."""
    if settings.quality.grader == "dqa":
        from gpu.dqa import DQAGrader

        return DQAGrader(settings=settings, residency=residency(settings))
    from gpu.preview import PreviewGrader

    return PreviewGrader()
