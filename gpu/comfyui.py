"""The `comfyui` video backend: fills the studio's workflow template and renders it on a ComfyUI server.

A render fills an API-format workflow template (MAS_COMFYUI_WORKFLOW) at the nodes named in
MAS_COMFYUI_NODES, runs it through `ComfyUIClient` (MAS_COMFYUI_URL) and streams the output node's file
into the path the studio chose. A wrong template or node map fails when the backend is built, not
mid-batch.

A render runs under the attempt's render id as ComfyUI's prompt id, so an attempt rendered again after a
crash follows or collects the prompt it already started instead of rendering again (see
`gpu.comfyui_client`).

Stopping a render: the caller's `should_stop()` is polled while the render runs, and when it answers
True the prompt is taken off ComfyUI's queue or interrupted, by its id, and the call raises
`RenderStopped`; the worker process and its resident models stay. Code running elsewhere (another thread,
a signal handler) calls `backend.interrupt()` instead, which stops the render in flight and makes the call
raise. A render left by any other exception (a SIGTERM turned into SystemExit, Celery's soft time limit)
is stopped on the server too.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu.comfyui_client import ComfyUIClient, Health
from gpu.comfyui_errors import ComfyUIError
from gpu.interfaces import Progress
from mas.config import Settings
from mas.errors import InvalidSettings

NAME = "comfyui"
VALUE_KEYS = ("prompt", "negative_prompt", "seed", "width", "height", "frames", "fps")
REQUIRED_KEYS = ("prompt", "seed", "output")
# Where an output node lists its files in /history: SaveVideo uses "images" (with "animated": [true]).
FILE_LISTS = ("images", "videos", "gifs")
# Celery's hard task_time_limit is MAS_MAX_RENDER_SECONDS and kills the process outright, so by default
# the backend gives up a little earlier, while it can still tell ComfyUI to stop.
TIMEOUT_SHARE = 0.95


class WorkflowError(ComfyUIError, InvalidSettings, ValueError):
    """The workflow template (MAS_COMFYUI_WORKFLOW) or its node map (MAS_COMFYUI_NODES) cannot work: it
    cannot take the values the studio sets (found when the backend is built), or its output node saves no
    file (found after a render)."""


@dataclass(frozen=True, kw_only=True)
class Slot:
    """One input of one node of the template."""

    node: str
    input: str


@dataclass(frozen=True, kw_only=True)
class Workflow:
    """An API-format workflow template and the slots where it takes the studio's values."""

    template: dict[str, Any]
    slots: dict[str, Slot]
    output_node: str

    @classmethod
    def load(cls, *, path: Path | None, nodes: dict[str, str]) -> Workflow:
        """Read and check the template, so a wrong one fails when the backend is built, not mid-batch."""
        if path is None:
            raise WorkflowError(
                "MAS_COMFYUI_WORKFLOW is not set: export the workflow from ComfyUI in API format "
                "(Workflow > Export (API)) and point MAS_COMFYUI_WORKFLOW at the file"
            )
        try:
            template = json.loads(Path(path).read_text())
        except OSError as exc:
            raise WorkflowError(f"cannot read the ComfyUI workflow {path}: {exc.strerror or exc}") from exc
        except ValueError as exc:
            raise WorkflowError(f"the ComfyUI workflow {path} is not JSON: {exc}") from exc
        if isinstance(template, dict) and "nodes" in template and "links" in template:
            raise WorkflowError(
                f"{path} is a UI-format workflow; export it in API format instead (Workflow > Export (API))"
            )
        if not isinstance(template, dict) or not all(
            isinstance(node, dict) and "class_type" in node and isinstance(node.get("inputs"), dict)
            for node in template.values()
        ):
            raise WorkflowError(f"{path} is not an API-format workflow (a map of node id -> {{class_type, inputs}})")
        unknown = sorted(set(nodes) - set(VALUE_KEYS) - {"output"})
        if unknown:
            raise WorkflowError(f"MAS_COMFYUI_NODES has unknown keys {unknown}; known: {', '.join(VALUE_KEYS)}, output")
        missing = [key for key in REQUIRED_KEYS if key not in nodes]
        if missing:
            raise WorkflowError(f"MAS_COMFYUI_NODES lacks {missing}; it needs {', '.join(REQUIRED_KEYS)}")
        slots = {key: _slot(template, path, key, spec) for key, spec in nodes.items() if key != "output"}
        output = nodes["output"]
        if output not in template:
            raise WorkflowError(
                f"the workflow {path} has no node {output!r} (MAS_COMFYUI_NODES[output], the node that saves "
                f"the video); its nodes are {', '.join(sorted(template))}"
            )
        return cls(template=template, slots=slots, output_node=output)

    def fill(self, values: dict[str, object]) -> dict[str, Any]:
        """A copy of the template with each mapped input set to its value."""
        workflow = copy.deepcopy(self.template)
        for key, slot in self.slots.items():
            workflow[slot.node]["inputs"][slot.input] = values[key]
        return workflow


def _slot(template: dict[str, Any], path: Path, key: str, spec: str) -> Slot:
    node, dot, name = spec.rpartition(".")
    if not dot or not node or not name:
        raise WorkflowError(f"MAS_COMFYUI_NODES[{key}] = {spec!r} should be NODE_ID.INPUT_NAME")
    if node not in template:
        raise WorkflowError(
            f"the workflow {path} has no node {node!r} (MAS_COMFYUI_NODES[{key}] = {spec!r}); "
            f"its nodes are {', '.join(sorted(template))}"
        )
    inputs = template[node]["inputs"]
    where = f"node {node} ({template[node]['class_type']}) of {path}"
    if name not in inputs:
        raise WorkflowError(
            f"{where} has no input {name!r} (MAS_COMFYUI_NODES[{key}] = {spec!r}); "
            f"its inputs are {', '.join(sorted(inputs))}"
        )
    value = inputs[name]
    if isinstance(value, list) and len(value) == 2 and isinstance(value[0], str):
        raise WorkflowError(
            f"input {name!r} of {where} is wired to node {value[0]}; point MAS_COMFYUI_NODES[{key}] at the "
            f"input of node {value[0]} that holds the value"
        )
    return Slot(node=node, input=name)


def run_seconds(entry: dict[str, Any]) -> float | None:
    """How long ComfyUI ran the prompt, from its history's execution_start and execution_success times."""
    times = {kind: (data or {}).get("timestamp") for kind, data in (entry.get("status") or {}).get("messages") or []}
    start, end = times.get("execution_start"), times.get("execution_success")
    return (end - start) / 1000 if isinstance(start, (int, float)) and isinstance(end, (int, float)) else None


class ComfyUIBackend:
    """The studio's video backend over a ComfyUI server (MAS_COMFYUI_URL, MAS_COMFYUI_WORKFLOW)."""

    name = NAME
    uses_this_gpu = False  # ComfyUI owns the GPU and queues the renders itself
    last_run_seconds: float | None = None  # from the prompt's history entry: its start to its end

    def __init__(self, *, settings: Settings, client: ComfyUIClient | None = None, timeout: float | None = None):
        """`client` and `timeout` default to what `settings` say; pass them to talk or wait differently."""
        self.workflow = Workflow.load(path=settings.comfyui.workflow, nodes=settings.comfyui.nodes)
        self.client = client or ComfyUIClient(url=settings.comfyui.url, retries=settings.comfyui.retries)
        self.timeout = settings.gpu.max_render_seconds * TIMEOUT_SHARE if timeout is None else timeout
        self.queue_ahead = settings.gpu.lookahead  # renders of this worker that may run before ours
        self.size = {
            "width": settings.video.width,
            "height": settings.video.height,
            "frames": settings.video.frames,
            "fps": settings.video.fps,
        }

    def __call__(
        self,
        *,
        prompt: str,
        negative_prompt: str = "",
        seed: int,
        output: Path,
        render_id: str,
        progress: Progress | None = None,
        should_stop: Callable[[], bool] | None = None,
        order: float | None = None,
    ) -> Path:
        """Render `prompt` into `output` as ComfyUI prompt `render_id` (or collect that prompt's render);
        a template without a negative_prompt slot ignores the negative. `order` is the prompt's place in
        ComfyUI's queue (its `number`: lower runs first). The time limit counts from when the prompt
        starts to run; before that it may wait behind `queue_ahead` renders of the same limit."""
        values = {"prompt": prompt, "negative_prompt": negative_prompt, "seed": seed, **self.size}
        entry = self.client.render(
            self.workflow.fill(values),
            prompt_id=render_id,
            progress=progress,
            timeout=self.timeout,
            should_stop=should_stop,
            number=order,
            queue_timeout=self.timeout * max(1, self.queue_ahead),
        )
        self.last_run_seconds = run_seconds(entry)
        return self.client.download(self._saved_file(entry), output)

    def interrupt(self) -> None:
        """Stop the render in flight, if any, from another thread or a signal handler."""
        self.client.interrupt()

    def free(self, *, unload_models: bool = True, free_memory: bool = True) -> None:
        """Make ComfyUI give back GPU memory, e.g. before local scoring models load."""
        self.client.free(unload_models=unload_models, free_memory=free_memory)

    def health(self) -> Health:
        return self.client.health()

    def _saved_file(self, entry: dict[str, Any]) -> dict[str, Any]:
        outputs = entry.get("outputs") or {}
        saved = outputs.get(self.workflow.output_node) or {}
        for key in FILE_LISTS:
            for file in saved.get(key) or []:
                if isinstance(file, dict) and file.get("filename"):
                    return file
        raise WorkflowError(
            f"ComfyUI finished but node {self.workflow.output_node} saved no file (nodes with outputs: "
            f"{', '.join(outputs) or 'none'}); MAS_COMFYUI_NODES[output] should be the SaveVideo node"
        )
