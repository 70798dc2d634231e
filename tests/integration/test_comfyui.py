"""The `comfyui` backend against a local ComfyUI protocol stand-in, over real HTTP and a real websocket."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpu.comfyui import ComfyUIBackend
from gpu.comfyui_client import ComfyUIClient
from gpu.comfyui_errors import ComfyUIRejected, ComfyUIRenderFailed, ComfyUITimeout, ComfyUIUnavailable
from gpu.interfaces import RenderStopped
from gpu.preview import PreviewRenderer
from mas.config import Settings
from tests.comfyui_server import ComfyUIStandIn, Script
from tests.ports import free_port

PROMPT = "a dragon over a misty lake, steady camera, sharp focus"
NEGATIVE = "blurry, watermark"
SEED = 123456789
NODES = {
    "prompt": "5222.value",
    "negative_prompt": "5223.value",
    "seed": "5232:5158.noise_seed",
    "width": "5200.width",
    "height": "5200.height",
    "frames": "5200.length",
    "fps": "5202.fps",
    "output": "5075",
}


def ltx2_workflow() -> dict[str, Any]:
    """An API-format workflow shaped like the seed's LTX-2 one (same prompt, seed and SaveVideo ids)."""
    return {
        "5222": {"class_type": "PrimitiveStringMultiline", "inputs": {"value": "placeholder"}},
        "5223": {"class_type": "PrimitiveStringMultiline", "inputs": {"value": ""}},
        "5210": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "ltx-2-19b-dev.safetensors"}},
        "5224": {"class_type": "CLIPTextEncode", "inputs": {"text": ["5222", 0], "clip": ["5210", 1]}},
        "5225": {"class_type": "CLIPTextEncode", "inputs": {"text": ["5223", 0], "clip": ["5210", 1]}},
        "5200": {
            "class_type": "EmptyLTXVLatentVideo",
            "inputs": {"width": 768, "height": 512, "length": 121, "batch_size": 1},
        },
        "5232:5158": {"class_type": "RandomNoise", "inputs": {"noise_seed": 42}},
        "5232:5160": {
            "class_type": "SamplerCustomAdvanced",
            "inputs": {"noise": ["5232:5158", 0], "latent_image": ["5200", 0], "guider": ["5224", 0]},
        },
        "5201": {"class_type": "VAEDecode", "inputs": {"samples": ["5232:5160", 0], "vae": ["5210", 2]}},
        "5202": {"class_type": "CreateVideo", "inputs": {"images": ["5201", 0], "fps": 24}},
        "5075": {
            "class_type": "SaveVideo",
            "inputs": {"video": ["5202", 0], "filename_prefix": "video/LTX_2", "format": "auto", "codec": "auto"},
        },
    }


@pytest.fixture(scope="module")
def mp4(tmp_path_factory) -> Path:
    """The real small mp4 the stand-in serves as every rendered video."""
    output = tmp_path_factory.mktemp("standin") / "fox.mp4"
    return PreviewRenderer(frames=6)(prompt="a red fox", negative_prompt="", seed=1, output=output, render_id="fox")


@pytest.fixture
def server(mp4):
    with ComfyUIStandIn(video=mp4) as stand_in:
        yield stand_in


@pytest.fixture
def template(tmp_path) -> Path:
    path = tmp_path / "ltx2_api.json"
    path.write_text(json.dumps(ltx2_workflow()))
    return path


def settings_for(url: str, template: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "video_backend": "comfyui", "comfyui_url": url, "comfyui_workflow": template, "comfyui_nodes": NODES,
        "video_width": 512, "video_height": 320, "video_frames": 49, "video_fps": 16,
    }
    return Settings(**{**values, **overrides})


def backend_for(url: str, template: Path, *, retries: int = 3, timeout: float = 20.0) -> ComfyUIBackend:
    client = ComfyUIClient(url=url, retries=retries, backoff_seconds=0.01, poll_seconds=0.05)
    return ComfyUIBackend(settings=settings_for(url, template), client=client, timeout=timeout)


@pytest.fixture
def make_backend(server, template) -> Callable[..., ComfyUIBackend]:
    def make(*, url: str | None = None, retries: int = 3, timeout: float = 20.0) -> ComfyUIBackend:
        return backend_for(url or server.url, template, retries=retries, timeout=timeout)

    return make


def render(
    backend: ComfyUIBackend, output: Path, progress=None, *, render_id: str | None = None, should_stop=None
) -> Path:
    return backend(
        prompt=PROMPT, negative_prompt=NEGATIVE, seed=SEED, output=output, render_id=render_id or str(uuid.uuid4()),
        progress=progress, should_stop=should_stop,
    )


def closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


def test_render_reports_progress_and_writes_the_mp4_where_the_studio_chose(server, make_backend, mp4, tmp_path):
    backend = make_backend()
    target = tmp_path / "videos" / "batch-1" / "video-7-attempt-1.mp4"
    calls: list[tuple[int, int]] = []

    assert render(backend, target, progress=lambda done, total: calls.append((done, total))) == target

    assert calls == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert target.read_bytes() == mp4.read_bytes() and target.read_bytes()[4:8] == b"ftyp"  # an mp4
    assert list(target.parent.iterdir()) == [target]  # no partial file left behind
    sent = server.prompts[-1]
    assert sent["client_id"] == backend.client.client_id and server.websockets == [backend.client.client_id]
    workflow = sent["prompt"]
    assert workflow["5222"]["inputs"]["value"] == PROMPT
    assert workflow["5223"]["inputs"]["value"] == NEGATIVE
    assert workflow["5232:5158"]["inputs"]["noise_seed"] == SEED
    assert workflow["5200"]["inputs"] == {"width": 512, "height": 320, "length": 49, "batch_size": 1}
    assert workflow["5202"]["inputs"]["fps"] == 16
    assert workflow["5224"]["inputs"]["text"] == ["5222", 0]  # links untouched
    assert backend.workflow.template["5222"]["inputs"]["value"] == "placeholder"  # template untouched
    assert server.views == [{"filename": "LTX_2_00001_.mp4", "subfolder": "video", "type": "output"}]


def test_rejected_workflow_names_the_node_and_is_not_retried(server, make_backend, tmp_path):
    server.script = Script(outcome="reject")
    with pytest.raises(ComfyUIRejected) as caught:
        render(make_backend(), tmp_path / "out.mp4")
    assert "node 5222 (PrimitiveStringMultiline): value: Required input is missing" in str(caught.value)
    assert "prompt_outputs_failed_validation" in str(caught.value)
    assert set(caught.value.node_errors) == {"5222"}
    assert len(server.prompts) == 1
    assert not (tmp_path / "out.mp4").exists()


def test_server_errors_are_retried_until_the_prompt_is_accepted(server, make_backend, tmp_path):
    server.script = Script(prompt_failures=2)
    target = render(make_backend(retries=3), tmp_path / "out.mp4")
    assert target.stat().st_size > 0
    assert len(server.prompts) == 3


def test_server_errors_on_every_try_make_comfyui_unavailable(server, make_backend, tmp_path):
    server.script = Script(prompt_failures=100)
    with pytest.raises(ComfyUIUnavailable, match=r"HTTP 500 to POST /prompt on 3 tries"):
        render(make_backend(retries=2), tmp_path / "out.mp4")
    assert len(server.prompts) == 3


def test_a_server_that_does_not_answer_says_what_to_do(make_backend, tmp_path):
    url = closed_port_url()
    backend = make_backend(url=url, retries=1)
    with pytest.raises(ComfyUIUnavailable) as caught:
        render(backend, tmp_path / "out.mp4", render_id="r-1")
    # a render first asks the server about its id, so that is the request that finds no server
    assert f"ComfyUI at {url} did not answer GET /history/r-1 on 2 tries" in str(caught.value)
    assert "is it running? set MAS_COMFYUI_URL" in str(caught.value)
    with pytest.raises(ComfyUIUnavailable, match="GET /system_stats"):
        backend.health()


@pytest.mark.parametrize("websocket", ["open", "refuse"])
def test_a_render_past_its_timeout_is_stopped_on_the_server(server, make_backend, tmp_path, websocket):
    server.script = Script(outcome="hang", websocket=websocket)
    with pytest.raises(ComfyUITimeout, match="ran past 0.5 s"):  # noqa: RUF043
        render(make_backend(timeout=0.5), tmp_path / "out.mp4")
    [prompt_id] = server.queued
    assert server.deletes == [prompt_id]
    assert server.interrupts == [{"prompt_id": prompt_id}]
    assert not (tmp_path / "out.mp4").exists()


@pytest.mark.parametrize("websocket", ["refuse", "drop"])
def test_without_a_websocket_the_backend_polls_history(server, make_backend, mp4, tmp_path, websocket):
    server.script = Script(websocket=websocket)
    backend = make_backend()
    calls: list[tuple[int, int]] = []
    target = render(backend, tmp_path / "out.mp4", progress=lambda done, total: calls.append((done, total)))
    assert target.read_bytes() == mp4.read_bytes()
    assert server.websockets == [backend.client.client_id]
    assert calls == ([] if websocket == "refuse" else [(1, 4)])


@pytest.mark.parametrize("websocket", ["open", "refuse"])
def test_execution_error_names_the_node_and_the_exception(server, make_backend, tmp_path, websocket):
    server.script = Script(outcome="error", websocket=websocket)
    with pytest.raises(ComfyUIRenderFailed) as caught:
        render(make_backend(), tmp_path / "out.mp4")
    assert str(caught.value) == (
        "ComfyUI failed at node 5232:5160 (SamplerCustomAdvanced): torch.OutOfMemoryError: Allocation on device"
    )
    assert caught.value.node_id == "5232:5160"
    assert server.interrupts == []  # it already ended: nothing to stop
    assert not (tmp_path / "out.mp4").exists()


@pytest.mark.parametrize("name", ["../../evil.mp4", "ABSOLUTE"])
def test_server_file_names_never_become_local_paths(server, make_backend, mp4, template, tmp_path, name):
    name = str(tmp_path / "evil-absolute.mp4") if name == "ABSOLUTE" else name
    server.script = Script(filename=name, subfolder="../..")
    target = tmp_path / "a" / "b" / "videos" / "video-1-attempt-1.mp4"

    assert render(make_backend(), target) == target

    assert target.read_bytes() == mp4.read_bytes()
    assert server.views == [{"filename": name, "subfolder": "../..", "type": "output"}]
    assert {p for p in tmp_path.rglob("*") if p.is_file()} == {template, target}
    for base in (target.parent, Path.cwd()):
        assert not (base / name).exists()


def once_rendering(backend: ComfyUIBackend, action: Callable[[], object]) -> threading.Thread:
    """A thread that runs `action` as soon as the backend has a prompt in flight."""

    def wait_then_act() -> None:
        deadline = time.monotonic() + 10
        while backend.client.prompt_id is None and time.monotonic() < deadline:
            time.sleep(0.01)
        action()

    thread = threading.Thread(target=wait_then_act)
    thread.start()
    return thread


def test_interrupt_from_another_thread_stops_the_render(server, make_backend, tmp_path):
    server.script = Script(outcome="hang")
    backend = make_backend()
    thread = once_rendering(backend, backend.interrupt)
    try:
        with pytest.raises(ComfyUIRenderFailed, match="was interrupted at node 5232:5160"):
            render(backend, tmp_path / "out.mp4")
    finally:
        thread.join()
    assert server.interrupts == [{"prompt_id": server.queued[0]}]


def test_sigterm_during_a_render_stops_it_on_the_server(server, make_backend, tmp_path):
    """What a revoked task does: its SIGTERM handler raises SystemExit, and the render is cancelled."""
    server.script = Script(outcome="hang")
    backend = make_backend()
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        thread = once_rendering(backend, lambda: os.kill(os.getpid(), signal.SIGTERM))
        with pytest.raises(SystemExit):
            render(backend, tmp_path / "out.mp4")
    finally:
        thread.join()
        signal.signal(signal.SIGTERM, previous)
    [prompt_id] = server.queued
    assert server.deletes == [prompt_id] and server.interrupts == [{"prompt_id": prompt_id}]


# --- re-attaching to a render by its id, and stopping one on request --------------------------------
def queue_of(server: ComfyUIStandIn) -> dict[str, list[str]]:
    """The ids GET /queue lists as running and as pending."""
    queue = httpx.get(server.url + "/queue").json()
    return {key: [item[1] for item in queue[key]] for key in ("queue_running", "queue_pending")}


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_an_unknown_render_id_is_submitted_under_that_id(server, make_backend, mp4, tmp_path):
    render_id = str(uuid.uuid4())
    target = render(make_backend(), tmp_path / "out.mp4", render_id=render_id)
    assert target.read_bytes() == mp4.read_bytes()
    assert server.prompts[-1]["prompt_id"] == render_id and server.queued == [render_id]
    assert server.executions_of(render_id) == 1


def test_a_finished_render_is_downloaded_without_rendering_it_again(server, make_backend, mp4, tmp_path):
    render_id = str(uuid.uuid4())
    render(make_backend(), tmp_path / "first.mp4", render_id=render_id)

    again = render(make_backend(), tmp_path / "again.mp4", render_id=render_id)  # a new worker, same attempt

    assert again.read_bytes() == mp4.read_bytes()
    assert server.queued == [render_id] and server.executions_of(render_id) == 1
    assert len(server.views) == 2


def test_a_render_that_failed_on_the_server_is_submitted_again(server, make_backend, mp4, tmp_path):
    render_id = str(uuid.uuid4())
    server.script = Script(outcome="error")
    with pytest.raises(ComfyUIRenderFailed):
        render(make_backend(), tmp_path / "out.mp4", render_id=render_id)
    server.script = Script()

    target = render(make_backend(), tmp_path / "out.mp4", render_id=render_id)

    assert target.read_bytes() == mp4.read_bytes()
    assert server.history_deletes == [render_id]  # the failed entry no longer answers for the new run
    assert server.queued == [render_id, render_id] and server.executions_of(render_id) == 2


def test_a_render_whose_client_died_is_followed_not_submitted_again(server, template, mp4, tmp_path):
    """A worker SIGKILLed mid-render: the server renders on, and the next worker follows that render."""
    server.script = Script(steps=40, step_seconds=0.05)
    render_id = str(uuid.uuid4())
    dying = subprocess.Popen([
        sys.executable, "-c",
        "import sys; from pathlib import Path; from tests.integration.test_comfyui import backend_for, render; "
        "render(backend_for(sys.argv[1], Path(sys.argv[2])), Path(sys.argv[3]), render_id=sys.argv[4])",
        server.url, str(template), str(tmp_path / "dead.mp4"), render_id,
    ])
    try:
        wait_for(lambda: server.executions_of(render_id) == 1, "the first worker's render to start", timeout=60)
        dead_client = server.prompts[-1]["client_id"]
    finally:
        dying.kill()
        dying.wait()
    assert queue_of(server)["queue_running"] == [render_id]  # the server renders on without its client
    follower = backend_for(server.url, template)
    calls: list[tuple[int, int]] = []

    target = render(follower, tmp_path / "out.mp4", lambda done, total: calls.append((done, total)),
                    render_id=render_id)

    assert target.read_bytes() == mp4.read_bytes()
    assert server.queued == [render_id] and server.executions_of(render_id) == 1
    assert server.websockets[-1] == dead_client != follower.client.client_id  # took over the dead session
    assert all(total == 40 for _, total in calls)
    assert not (tmp_path / "dead.mp4").exists()


@pytest.mark.parametrize("websocket", ["open", "refuse"])
def test_should_stop_interrupts_a_running_render(server, make_backend, tmp_path, websocket):
    server.script = Script(outcome="hang", websocket=websocket)
    render_id = str(uuid.uuid4())
    asked: list[float] = []

    def should_stop() -> bool:
        asked.append(time.monotonic())
        return server.executions_of(render_id) == 1

    started = time.monotonic()
    with pytest.raises(RenderStopped, match="was stopped on request"):
        render(make_backend(), tmp_path / "videos" / "out.mp4", render_id=render_id, should_stop=should_stop)

    assert time.monotonic() - started < 3
    assert max(b - a for a, b in itertools.pairwise(asked)) < 1  # asked at least every half second or so
    assert server.interrupts == [{"prompt_id": render_id}]
    assert queue_of(server) == {"queue_running": [], "queue_pending": []}
    assert server.history[render_id]["status"]["status_str"] == "error"  # interrupted, not finished
    assert list((tmp_path / "videos").glob("*")) == []


def test_should_stop_deletes_a_pending_render_from_the_queue(server, make_backend, tmp_path):
    server.script = Script(outcome="hang")
    other = str(uuid.uuid4())  # someone else's render, running ahead of ours
    httpx.post(server.url + "/prompt", json={"prompt": ltx2_workflow(), "prompt_id": other}).raise_for_status()
    wait_for(lambda: server.executions_of(other) == 1, "the other render to start")
    render_id = str(uuid.uuid4())

    with pytest.raises(RenderStopped):
        render(make_backend(), tmp_path / "videos" / "out.mp4", render_id=render_id,
               should_stop=lambda: render_id in queue_of(server)["queue_pending"])

    assert server.deletes == [render_id] and server.executions_of(render_id) == 0
    assert queue_of(server) == {"queue_running": [other], "queue_pending": []}  # the other render goes on
    assert all(body == {"prompt_id": render_id} for body in server.interrupts)
    assert list((tmp_path / "videos").glob("*")) == []


def test_a_render_asked_to_stop_before_it_starts_submits_nothing(server, make_backend, tmp_path):
    with pytest.raises(RenderStopped):
        render(make_backend(), tmp_path / "videos" / "out.mp4", should_stop=lambda: True)
    assert server.prompts == [] and list((tmp_path / "videos").glob("*")) == []






def test_free_and_health(server, make_backend):
    backend = make_backend()
    backend.free()
    backend.free(unload_models=False)
    assert server.frees == [
        {"unload_models": True, "free_memory": True},
        {"unload_models": False, "free_memory": True},
    ]
    health = backend.health()
    [device] = health.devices
    assert device.type == "cuda" and device.vram_total > device.vram_free > 0
    assert health.version.startswith("0.3")


