"""The studio against a real ComfyUI 0.3.75 (tests/comfyui_real.py): pipelined renders, priorities, cancel,
two gpu workers with a ComfyUI each. What is checked comes from ComfyUI's own history (when each prompt
was queued, started and ended, by ComfyUI's clock), not from the studio's task events.

Renders take a second or two (the weightless timed node), and every threshold the studio waits on is
scaled down with them (lease heartbeat and expiry), as in the durable-steps tests.
"""

from __future__ import annotations

import itertools
import json
import tempfile
from pathlib import Path

import pytest
import sqlalchemy as sa

from mas import db
from mas.models import Attempt, Batch, BatchStatus, Video, VideoState
from mas.video import check_video
from tests import comfyui_real
from tests.comfyui_real import NODE_MAP, RealComfyUI, Render, write_workflow
from tests.parts import need
from tests.studio import IsolatedStudio

need(
    "COMFYUI",
    None if comfyui_real.available() else "no real ComfyUI is built here (bash scripts/comfyui-env.sh)",
    module=True,
)

SCALED = {"MAS_LEASE_HEARTBEAT_SECONDS": "0.5", "MAS_LEASE_EXPIRY_SECONDS": "3"}


@pytest.fixture(scope="module")
def comfyui(tmp_path_factory):
    with RealComfyUI(tmp_path_factory.mktemp("comfyui")) as server:
        yield server


@pytest.fixture
def server(comfyui):
    comfyui.clear()
    yield comfyui
    comfyui.clear()


@pytest.fixture
def data_dir():
    with tempfile.TemporaryDirectory(prefix="mas-comfyui-") as tmp:
        Path(tmp).chmod(0o755)  # as root, the embedded PostgreSQL runs as another user that must enter it
        yield Path(tmp)


def studio_env(url: str, data_dir: Path, *, seconds: float, lookahead: int = 1) -> dict[str, str]:
    workflow = write_workflow(data_dir / f"workflow-{seconds}.json", seconds=seconds)
    return dict(
        MAS_VIDEO_BACKEND="comfyui", MAS_COMFYUI_URL=url, MAS_COMFYUI_WORKFLOW=str(workflow),
        MAS_COMFYUI_NODES=json.dumps(NODE_MAP), MAS_VIDEO_FRAMES="8", MAS_VIDEO_FPS="12",
        MAS_GPU_LOOKAHEAD=str(lookahead), **SCALED,
    )


def attempts_of(studio: IsolatedStudio, batch_id: int) -> list[Attempt]:
    with db.session_scope(studio.settings) as s:
        return list(s.scalars(sa.select(Attempt).join(Video).where(Video.batch_id == batch_id).order_by(Attempt.id)))


def created(render: Render) -> float:
    """When ComfyUI queued the prompt (its own record, seconds)."""
    return render.extra["create_time"] / 1000


def test_the_backend_renders_a_playable_mp4_on_a_real_comfyui(server, tmp_path):
    from gpu.comfyui import ComfyUIBackend
    from mas.config import Settings

    settings = Settings(
        video_backend="comfyui", comfyui_url=server.url, comfyui_nodes=NODE_MAP, video_frames=8, video_fps=12,
        comfyui_workflow=write_workflow(tmp_path / "workflow.json", seconds=0.4), data_dir=tmp_path / "data",
    )
    steps: list[tuple[int, int]] = []
    backend = ComfyUIBackend(settings=settings)
    out = backend(
        prompt="a kite over dunes", negative_prompt="", seed=7, output=tmp_path / "kite.mp4",
        render_id="0b1c5a9e-7d0e-4c39-9a57-1f6f3f3b0d01", progress=lambda done, total: steps.append((done, total)),
        order=1234.5,
    )
    check_video(out)
    assert steps[-1] == (4, 4)  # ComfyUI's own progress events, one per step of the node
    (render,) = server.renders()
    assert render.prompt_id == "0b1c5a9e-7d0e-4c39-9a57-1f6f3f3b0d01" and render.status == "success"
    assert render.number == 1234.5  # the place the studio asked for in ComfyUI's queue
    assert abs(backend.last_run_seconds - (render.ended - render.started)) < 0.01  # ComfyUI's own record
    assert backend.last_run_seconds >= 0.4  # the node's chosen duration


def test_renders_are_pipelined_the_next_prompt_already_waits_in_comfyui(server, data_dir):
    """With MAS_GPU_LOOKAHEAD=1 the gpu worker keeps the next render queued in ComfyUI while one runs, so
    ComfyUI goes from one to the next without a round trip through the studio. Renders of 4 s: the next prompt
    is handed over within a render's time even on a machine loaded by other tests (1.5 s once fell short)."""
    with IsolatedStudio(data_dir / "studio", **studio_env(server.url, data_dir, seconds=4)) as studio:
        studio.worker("cpu", concurrency=2)
        studio.worker("gpu")
        batch_id = studio.enqueue("Create 4 videos of lighthouses")
        studio.wait_batch(batch_id, timeout=240)
        attempts = attempts_of(studio, batch_id)
    renders = server.renders()
    assert sorted(r.prompt_id for r in renders) == sorted(a.render_id for a in attempts)  # one each, no more
    # whenever the next render's prompt was written before the render ahead of it started, it was already
    # queued in ComfyUI before that render ended: ComfyUI never waited for the studio when work was ready
    ready = {a.render_id: a.created_at.timestamp() for a in attempts}
    checked = 0
    for previous, following in itertools.pairwise(renders):
        if ready[following.prompt_id] < previous.started:
            assert created(following) < previous.ended, (previous, following)
            checked += 1
    assert checked >= 2  # the first attempts, written together at planning, at least


def test_a_high_priority_request_renders_before_the_rest_of_a_long_batch(server, data_dir):
    with IsolatedStudio(data_dir / "studio", **studio_env(server.url, data_dir, seconds=1.5)) as studio:
        studio.worker("cpu", concurrency=2)
        studio.worker("gpu")
        # a batch long enough that it is still rendering when the urgent request is ready, however long the
        # command and the planning take on a loaded machine; the rest is cancelled at the end
        batch_id = studio.enqueue("Create 12 videos of lighthouses")
        studio.wait_until(lambda: len(server.renders()) >= 2, timeout=120, what="the batch to be rendering")
        result = studio.mas("enqueue", "--priority", "high", "Create a video of a red kite")
        assert result.returncode == 0 and "(high priority)" in result.stdout, result.stdout + result.stderr
        urgent_id = int(result.stdout.split()[1].rstrip(":"))
        studio.wait_batch(urgent_id, timeout=120)
        urgent_attempts = attempts_of(studio, urgent_id)
        urgent = {a.render_id for a in urgent_attempts}
        # ready for the GPU: its prompt written (the attempt row's transaction began just before; on a busy
        # machine the command and the planning before it take seconds, renders run while they do)
        ready = min(a.created_at.timestamp() for a in urgent_attempts)
        batch = {a.render_id for a in attempts_of(studio, batch_id) if a.number == 1}
        renders = server.renders()
        urgent_start = min(r.started for r in renders if r.prompt_id in urgent)
        of_batch = [r for r in renders if r.prompt_id in batch]
        behind = [r for r in of_batch if r.started > urgent_start]
        assert behind, "the batch had finished before the urgent request was ready: nothing was overtaken"
        ahead = [r for r in of_batch if ready < r.started < urgent_start]
        # once it was ready, at most the render already queued in ComfyUI went first
        assert len(ahead) <= 1, (ahead, ready, urgent_start)
        stopped = studio.mas("cancel", str(batch_id))  # the rest of the batch is not needed (on a loaded
        assert stopped.returncode == 0 or "already done" in stopped.stderr, stopped.stderr  # machine it may be done)


def test_cancel_while_renders_are_pipelined_leaves_nothing_in_comfyui(server, data_dir):
    with IsolatedStudio(data_dir / "studio", **studio_env(server.url, data_dir, seconds=3.0, lookahead=2)) as studio:
        studio.worker("cpu", concurrency=2)
        gpu = studio.worker("gpu")
        batch_id = studio.enqueue("Create 5 videos of volcanoes")
        studio.wait_until(lambda: server.queue()["queue_running"] and len(server.queue()["queue_pending"]) >= 2,
                          timeout=120, what="a render running and two queued behind it in ComfyUI")
        result = studio.mas("cancel", str(batch_id))
        assert result.returncode == 0, result.stderr
        studio.wait_until(lambda: not server.queue()["queue_running"] and not server.queue()["queue_pending"],
                          timeout=20, what="ComfyUI to have nothing running or queued")
        started = len(server.renders())
        assert studio.mas("recover").returncode == 0  # reconcile: nothing of a cancelled batch is sent again
        studio.wait_quiet()
        assert len(server.renders()) == started and not server.queue()["queue_pending"]
        assert all(v.state == VideoState.cancelled for v in studio.videos(batch_id))
        with db.session_scope(studio.settings) as s:
            assert s.get(Batch, batch_id).status == BatchStatus.cancelled
        assert gpu.proc.poll() is None  # the worker stays


def test_two_gpu_workers_with_a_comfyui_each_share_a_batch_and_never_render_an_attempt_twice(server, data_dir):
    with RealComfyUI(data_dir / "second-comfyui") as second:
        with IsolatedStudio(data_dir / "studio", **studio_env(server.url, data_dir, seconds=1.0)) as studio:
            studio.worker("cpu", concurrency=2)
            studio.worker("gpu", MAS_COMFYUI_URL=server.url, MAS_GPU_DEVICE="cuda:0")
            studio.worker("gpu", MAS_COMFYUI_URL=second.url, MAS_GPU_DEVICE="cuda:1")
            batch_id = studio.enqueue("Create 6 videos of glaciers")
            studio.wait_batch(batch_id, timeout=240)
            attempts = attempts_of(studio, batch_id)
            status = studio.mas("status", str(batch_id))
        first_ids = [r.prompt_id for r in server.renders()]
        second_ids = [r.prompt_id for r in second.renders()]
    assert first_ids and second_ids  # both GPUs worked
    rendered = first_ids + second_ids
    assert sorted(rendered) == sorted(a.render_id for a in attempts)  # each attempt once, on one server
    # each worker published its own stats; `mas status` lists both, with the device each was given
    assert status.returncode == 0, status.stderr
    assert "gpu worker gpu1@reliability (cuda:0)" in status.stdout and "gpu worker gpu2@reliability (cuda:1)" in status.stdout
