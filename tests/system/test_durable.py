"""Durable steps at a compressed production timescale: renders of seconds, with every threshold scaled
down with them (lease heartbeat and expiry, reconcile interval and age), on real workers, Postgres and
Redis. Renders through ComfyUI go to the protocol stand-in of `tests.comfyui_server` (fault injection: it
keeps executing a prompt whose client died, as the real server does, and counts executions per prompt id).
"""

from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import sqlalchemy as sa

from mas import db
from mas.models import Attempt, Batch, BatchStatus, Video, VideoState
from tests.studio import IsolatedStudio

SCALED = {  # production: heartbeat 10 s, expiry 60 s, reconcile every 60 s for videos idle 120 s
    "MAS_LEASE_HEARTBEAT_SECONDS": "0.5",
    "MAS_LEASE_EXPIRY_SECONDS": "2",
    "MAS_RECONCILE_EVERY_SECONDS": "1",
    "MAS_RECONCILE_AFTER_SECONDS": "3",
}
FINAL = (VideoState.accepted, VideoState.failed, VideoState.cancelled)


@pytest.fixture
def data_dir():
    with tempfile.TemporaryDirectory(prefix="mas-durable-") as tmp:
        Path(tmp).chmod(0o755)  # as root, the embedded PostgreSQL runs as another user that must enter it
        yield Path(tmp)


def _attempts(studio: IsolatedStudio, batch_id: int) -> list[Attempt]:
    with db.session_scope(studio.settings) as s:
        return list(s.scalars(sa.select(Attempt).join(Video).where(Video.batch_id == batch_id).order_by(Attempt.id)))


def _batch(studio: IsolatedStudio, batch_id: int) -> Batch:
    with db.session_scope(studio.settings) as s:
        return s.get(Batch, batch_id)


def _log_count(studio: IsolatedStudio, text: str) -> int:
    return sum(w.log.read_text().count(text) for w in studio.workers)


def _comfyui_env(server, tmp: Path) -> dict[str, str]:
    from tests.comfyui_server import write_workflow

    return dict(
        MAS_VIDEO_BACKEND="comfyui",
        MAS_COMFYUI_WORKFLOW=str(write_workflow(tmp / "workflow.json")),
        MAS_COMFYUI_URL=server.url,
        MAS_COMFYUI_RETRIES="0",
        **SCALED,
    )


def _stand_in(tmp: Path, *, render_seconds: float):
    from gpu.preview import PreviewRenderer
    from tests.comfyui_server import ComfyUIStandIn, Script

    video = PreviewRenderer()(prompt="red", negative_prompt="", seed=1, output=tmp / "served.mp4", render_id="x")
    return ComfyUIStandIn(video=video, script=Script(steps=4, step_seconds=render_seconds / 4))


def _each_attempt_rendered_once(server, attempts: list[Attempt]) -> None:
    assert attempts and all(a.render_id for a in attempts)
    counts = {a.render_id: server.executions_of(a.render_id) for a in attempts}
    assert set(counts.values()) == {1}, counts


def test_renders_that_together_outlast_every_threshold_are_never_taken_for_lost(data_dir):
    """Six renders of 1.5 s, graded and reviewed, take far longer than the lease expiry and the reconcile
    age; beat reconciles every second all along. Nothing is re-sent, nothing is failed for being slow."""
    with IsolatedStudio(data_dir, MAS_PREVIEW_RENDER_SECONDS="1.5", **SCALED) as studio:
        studio.worker("cpu", concurrency=2)
        studio.worker("gpu")
        studio.beat()
        started = time.monotonic()
        batch_id = studio.enqueue("Create 6 videos of lighthouses")
        studio.wait_batch(batch_id, timeout=300)
        took = time.monotonic() - started
        videos = studio.videos(batch_id)
        attempts = _attempts(studio, batch_id)
        reconciles = _log_count(studio, "tasks.maintenance.reconcile[")
        assert took > 3 * float(SCALED["MAS_RECONCILE_AFTER_SECONDS"])
        assert reconciles >= 5  # reconcile kept looking while the batch ran
        assert _log_count(studio, "reconcile: replanned") == 0  # it found nothing lost
        assert all(v.state in (VideoState.accepted, VideoState.failed) for v in videos)
        assert not [r for v in videos for r in v.failure_reasons if "failed:" in r or "lost" in r]
        # each attempt rendered once: one finished render task per attempt, no more
        assert studio_renders(studio) == len(attempts)


def studio_renders(studio: IsolatedStudio) -> int:
    """Renders that ran to the end (a duplicate delivery that found the work done or running is not one)."""
    return sum(
        1
        for w in studio.workers
        for line in w.log.read_text().splitlines()
        if re.search(r"render of video \d+ attempt \d+ rendered in", line)
    )


def test_duplicate_deliveries_resume_and_recover_render_each_attempt_once(data_dir):
    """While a batch renders: the same render delivered twice at once, `mas recover` and `mas resume`."""
    from mas.domain.steps import BY_NAME, StepPayload
    from mas.pipeline.chains import video_chain
    from mas.runtime.app import app_for

    with _stand_in(data_dir, render_seconds=2.0) as server:  # noqa: SIM117
        with IsolatedStudio(data_dir / "studio", **_comfyui_env(server, data_dir)) as studio:
            studio.worker("cpu", concurrency=2)
            studio.worker("gpu")
            studio.worker("gpu")  # a second gpu worker: two deliveries really run at once
            batch_id = studio.enqueue("Create 3 videos of glaciers")
            studio.wait_until(
                lambda: any(v.state == VideoState.rendering for v in studio.videos(batch_id)), what="a render to start"
            )
            video = next(v for v in studio.videos(batch_id) if v.state == VideoState.rendering)
            sender = app_for(studio.settings)
            payload = StepPayload(video_id=video.id, attempt=video.attempt_count)
            for _ in range(2):  # a duplicate delivery carries the rest of its chain, as a redelivered message does
                video_chain(sender, payload, start=BY_NAME["render"], priority="normal").apply_async()
            for command in (("recover",), ("resume", "--yes"), ("recover",)):
                result = studio.mas(*command)
                assert result.returncode == 0, result.stderr
            studio.wait_batch(batch_id, timeout=240)
            attempts = _attempts(studio, batch_id)
    _each_attempt_rendered_once(server, attempts)
    assert len(server.queued) == len(attempts)


def test_a_gpu_worker_killed_mid_render_reattaches_to_the_running_prompt(data_dir):
    """SIGKILL of the gpu worker while ComfyUI renders: the prompt keeps running there; the re-sent render
    follows it instead of submitting another, and the video finishes with one execution."""
    with _stand_in(data_dir, render_seconds=4.0) as server:  # noqa: SIM117
        with IsolatedStudio(data_dir / "studio", **_comfyui_env(server, data_dir)) as studio:
            studio.worker("cpu")
            gpu = studio.worker("gpu")
            batch_id = studio.enqueue("Create a video of a comet")
            studio.wait_until(lambda: server.running_prompt() is not None, what="the render to run in ComfyUI")
            _, result = studio.kill_mid_render(gpu, batch_id)
            assert result.returncode == 0 and "re-sent 1 video" in result.stdout, result.stdout + result.stderr
            studio.wait_batch(batch_id, timeout=180)
            attempts = _attempts(studio, batch_id)
            (video,) = studio.videos(batch_id)
    assert video.state in (VideoState.accepted, VideoState.failed)
    _each_attempt_rendered_once(server, attempts)


def test_cancel_during_a_render_stops_it_and_nothing_of_the_batch_runs_again(data_dir):
    with _stand_in(data_dir, render_seconds=6.0) as server:  # noqa: SIM117
        with IsolatedStudio(data_dir / "studio", **_comfyui_env(server, data_dir)) as studio:
            studio.worker("cpu")
            gpu = studio.worker("gpu")
            pool = {p.pid for p in psutil.Process(gpu.proc.pid).children(recursive=True)}
            batch_id = studio.enqueue("Create 2 videos of volcanoes")
            studio.wait_until(lambda: server.running_prompt() is not None, what="a render to run in ComfyUI")
            running = server.running_prompt()
            result = studio.mas("cancel", str(batch_id))
            assert result.returncode == 0, result.stderr
            studio.wait_until(
                lambda: server.running_prompt() is None and not server.pending_prompts(),
                timeout=15,
                what="ComfyUI to be idle",
            )
            assert running in [i.get("prompt_id") for i in server.interrupts]  # the targeted interrupt
            submitted = len(server.queued)
            for command in (("recover",), ("resume", "--yes")):
                assert studio.mas(*command).returncode == 0
            studio.wait_quiet()  # reconcile and resume have run, and whatever they sent
            assert len(server.queued) == submitted
            assert all(v.state == VideoState.cancelled for v in studio.videos(batch_id))
            assert _batch(studio, batch_id).status == BatchStatus.cancelled
            # the worker and its pool process survived the cancel
            assert gpu.proc.poll() is None
            assert {p.pid for p in psutil.Process(gpu.proc.pid).children(recursive=True)} == pool


def test_pause_holds_a_batch_and_continue_finishes_it(data_dir):
    with IsolatedStudio(data_dir, MAS_PREVIEW_RENDER_SECONDS="0.2", **SCALED) as studio:
        batch_id = studio.enqueue("Create 2 videos of kites")
        assert studio.mas("pause", str(batch_id)).returncode == 0
        studio.worker("cpu")
        studio.worker("gpu")
        for command in (("recover",), ("resume", "--yes")):  # reconcile and resume, each run to its end
            assert studio.mas(*command).returncode == 0
        studio.wait_quiet()  # and whatever they sent has run
        assert _batch(studio, batch_id).status == BatchStatus.paused and studio.videos(batch_id) == []
        again = studio.mas("pause", str(batch_id))
        assert again.returncode == 1 and "not queued or running" in again.stderr
        assert studio.mas("continue", str(batch_id)).returncode == 0
        studio.wait_batch(batch_id, timeout=120)
        assert all(v.state in FINAL for v in studio.videos(batch_id))
