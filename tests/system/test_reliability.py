"""The reliability suite: real Redis, Postgres and workers, broken on purpose; nothing may be lost.

Each test runs its own isolated studio (tests/studio.py) so it can kill workers, wipe the broker or
restart the database without touching the rest of the test session. RELIABILITY.md records what this suite
tries and what survives.
"""

from __future__ import annotations

import json
import tempfile
import time
from datetime import UTC
from pathlib import Path

import pytest
import sqlalchemy as sa

from mas import db
from mas.domain.identity import STUDIO
from mas.memory import blocks
from mas.models import ArchivalPassage, Attempt, Batch, BatchStatus, Schedule, Video, VideoState
from mas.pipeline import leases
from mas.runtime import services
from mas.runtime.clients import redis_client
from tests.studio import IsolatedStudio

FINAL = (VideoState.accepted, VideoState.failed)


@pytest.fixture
def studio(request):
    marker = request.node.get_closest_marker("studio_env")
    env = marker.kwargs if marker else {}
    with tempfile.TemporaryDirectory(prefix="mas-rel-") as tmp:
        Path(tmp).chmod(0o755)  # the embedded PostgreSQL runs as another user when we are root
        with IsolatedStudio(Path(tmp), **env) as s:
            yield s


def assert_batch_exact(studio: IsolatedStudio, batch_id: int, total: int) -> list[Video]:
    """Every video final, none lost, none counted or accepted twice."""
    videos = studio.videos(batch_id)
    assert len(videos) == total
    assert all(v.state in FINAL for v in videos), [(v.id, v.state) for v in videos]
    queue = blocks.read(studio.settings, STUDIO, "production_queue")
    assert queue["BATCH_COMPLETE"] == total and queue["PENDING_VIDEOS"] == []
    with db.session_scope(studio.settings) as s:
        for v in videos:
            attempts = s.scalars(sa.select(Attempt).where(Attempt.video_id == v.id)).all()
            assert sorted(a.number for a in attempts) == list(range(1, len(attempts) + 1))
            successes = s.scalar(
                sa.select(sa.func.count())
                .select_from(ArchivalPassage)
                .where(
                    ArchivalPassage.tags.contains(["success"]), ArchivalPassage.meta["video_id"].as_integer() == v.id
                )
            )
            assert successes == (1 if v.state == VideoState.accepted else 0)
    return videos


def with_workers(studio: IsolatedStudio, request: str) -> int:
    """A cpu worker (2 processes) and a gpu worker started, then `request` enqueued: its batch."""
    studio.worker("cpu", concurrency=2)
    studio.worker("gpu")
    return studio.enqueue(request)


def one_video_through(studio: IsolatedStudio, request: str, *, timeout: float = 180) -> Video:
    """A cpu and a gpu worker started, and a batch of one video run to its end: the video."""
    studio.worker("cpu")
    studio.worker("gpu")
    batch_id = studio.enqueue(request)
    studio.wait_batch(batch_id, timeout=timeout)
    (video,) = assert_batch_exact(studio, batch_id, 1)
    return video


def recover_and_finish(studio: IsolatedStudio, batch_id: int, total: int) -> None:
    """`mas recover` succeeds, and the batch ends as `assert_batch_exact` wants it."""
    result = studio.mas("recover")
    assert result.returncode == 0, result.stderr
    studio.wait_batch(batch_id)
    assert_batch_exact(studio, batch_id, total)


@pytest.mark.studio_env(MAS_PREVIEW_RENDER_SECONDS="2", MAS_LEASE_HEARTBEAT_SECONDS="0.5", MAS_LEASE_EXPIRY_SECONDS="2")
def test_gpu_worker_killed_mid_render(studio):
    studio.worker("cpu", concurrency=2)
    gpu = studio.worker("gpu")
    batch_id = studio.enqueue("Create 3 videos of copper automatons")
    studio.wait_until(
        lambda: any(v.state == VideoState.rendering for v in studio.videos(batch_id)), what="a render in flight"
    )
    rendering = {v.id for v in studio.videos(batch_id) if v.state == VideoState.rendering}
    gpu.kill()  # the render dies with its worker; its message stays unacked in Redis
    studio.worker("gpu")  # it ends its dead predecessor's leases at start; else they expire
    studio.wait_until(lambda: not rendering & leases.running(studio.settings), what="the killed render's lease to end")
    recover_and_finish(studio, batch_id, 3)


@pytest.mark.studio_env(MAS_PREVIEW_RENDER_SECONDS="1")
def test_broker_wiped_mid_batch(studio):
    batch_id = with_workers(studio, "Create 4 videos of paper lanterns")
    studio.wait_until(lambda: sum(v.state in FINAL for v in studio.videos(batch_id)) >= 1, what="first video")
    redis_client(studio.settings).flushall()  # every queued message and result is gone
    recover_and_finish(studio, batch_id, 4)


@pytest.mark.studio_env(MAS_PREVIEW_RENDER_SECONDS="1")
def test_postgres_restarted_mid_batch(studio):
    batch_id = with_workers(studio, "Create 3 videos of salt flats")
    studio.wait_until(
        lambda: any(v.state != VideoState.writing for v in studio.videos(batch_id)), what="work under way"
    )
    services.stop_postgres(studio.settings)
    time.sleep(3)  # the outage: 3 s of work under way meeting no database (not a wait for anything)
    services.start_postgres(studio.settings)
    studio.wait_batch(batch_id, timeout=240)
    assert_batch_exact(studio, batch_id, 3)


@pytest.mark.studio_env(
    MAS_PREVIEW_RENDER_SECONDS="1",
    MAS_LEASE_HEARTBEAT_SECONDS="0.5",
    MAS_LEASE_EXPIRY_SECONDS="2",
    MAS_RECONCILE_EVERY_SECONDS="2",
    MAS_RECONCILE_AFTER_SECONDS="8",
)
def test_redis_restarted_mid_batch_workers_survive(studio):
    """Redis away for a moment while steps run: every worker reconnects (none exits), the batch completes
    exactly (nothing lost, nothing twice), and no video fails for the lost connection. A message a worker had
    reserved when the connection dropped is found by beat's reconcile, as in production (thresholds scaled)."""
    cpu, gpu = studio.worker("cpu", concurrency=2), studio.worker("gpu")
    studio.beat()
    batch_id = studio.enqueue("Create 3 videos of tide pools")
    studio.wait_until(
        lambda: any(v.state != VideoState.writing for v in studio.videos(batch_id)), what="work under way"
    )
    services.stop_redis(studio.settings)
    services.start_redis(studio.settings)
    studio.wait_batch(batch_id, timeout=300)
    assert_batch_exact(studio, batch_id, 3)
    assert cpu.proc.poll() is None and gpu.proc.poll() is None, "a worker exited when Redis went away"
    assert "Unrecoverable error" not in cpu.log.read_text() + gpu.log.read_text()
    assert not [r for v in studio.videos(batch_id) for r in v.failure_reasons if "failed:" in r]


def test_task_that_kills_its_worker_is_quarantined(studio):
    studio.worker_args = ["--include", "tests.crashing_tasks"]
    cpu = studio.worker("cpu")
    from mas.runtime.app import Studio
    from tests.crashing_tasks import CRASH_TASK

    app = Studio(studio.settings)
    result = app.send_task(CRASH_TASK)
    with pytest.raises(Exception, match="given up"):  # given up, not looping
        result.get(timeout=120)
    deliveries = int(redis_client(studio.settings).get(f"mas:deliveries:{result.id}:0"))
    assert deliveries == studio.settings.reliability.max_deliveries + 1
    assert cpu.proc.poll() is None  # the worker itself survives its children's deaths
    assert "giving it up" in cpu.log.read_text()


def test_gpu_worker_goes_on_after_failure_handlers_that_fail(studio):
    """A gpu task whose failure handler fails in turn (a step's `on_failure` meeting a database still away)
    fails, and its message is acknowledged: it does not hold one of the gpu worker's slots for good. (Celery's
    thread pool dropped such a task unacknowledged: after 1 + MAS_GPU_LOOKAHEAD of them the gpu worker took
    no more work until it was restarted; `mas.runtime.threads`.)"""
    studio.worker_args = ["--include", "tests.crashing_tasks"]
    gpu = studio.worker("gpu")
    from mas import names
    from mas.runtime.app import Studio
    from tests.crashing_tasks import FAIL_TWICE_TASK

    app = Studio(studio.settings)
    failing = [app.send_task(FAIL_TWICE_TASK) for _ in range(2 * (1 + studio.settings.gpu.lookahead))]
    for result in failing:
        with pytest.raises(RuntimeError):
            result.get(timeout=60)
    assert app.send_task(names.GPU_PING, args=["after"]).get(timeout=30)["tag"] == "after"
    assert gpu.log.read_text().count("Task handler raised error") == len(failing)
    unacked = redis_client(studio.settings)
    studio.wait_until(lambda: not unacked.zcard("unacked_index"), timeout=10, what="every message acknowledged")


def _two_triggers(settings_env: dict[str, str]) -> list[int]:
    import os

    os.environ.update(settings_env)
    from mas import db
    from mas.config import Settings
    from mas.pipeline.production import run_due_schedules

    settings = Settings()
    db.find(settings)  # a new process finds its database as it starts
    return run_due_schedules(settings)


def test_scheduled_batch_runs_exactly_once(studio):
    from datetime import datetime, timedelta
    from multiprocessing import get_context

    from mas.domain.requests import parse_request
    from mas.pipeline.production import schedule

    later = schedule(
        studio.settings, STUDIO,
        parse_request("Create 2 videos of night trains", studio.settings),
        run_at=datetime.now(UTC) + timedelta(hours=6),
    )
    due = schedule(
        studio.settings, STUDIO,
        parse_request("Create 2 videos of dawn ferries", studio.settings),
        run_at=datetime.now(UTC) - timedelta(seconds=1),
    )
    env = {"MAS_DATA_DIR": str(studio.data_dir)}
    with get_context("spawn").Pool(3) as pool:  # three beats (or one restarted twice) fire together
        sent = pool.map(_two_triggers, [env] * 3)
    assert sorted(b for batch_ids in sent for b in batch_ids) == [1]
    with db.session_scope(studio.settings) as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(Batch)) == 1
        assert s.get(Schedule, due).status == "sent" and s.get(Schedule, due).batch_id == 1
        assert s.get(Schedule, later).status == "scheduled"
    result = studio.mas("schedule", "cancel", str(later))
    assert result.returncode == 0
    again = studio.mas("schedule", "cancel", str(due))
    assert again.returncode != 0 and "no pending schedule" in again.stderr


def _garbage(path: Path) -> Path:
    path.write_bytes(b"\x00\x01 this is not an mp4 " * 100)
    return path


@pytest.mark.xdist_group("reliability-generators")  # under pytest -n, apart from the module's other long tests
@pytest.mark.parametrize("outcome", ["error", "hang", "garbage", "unreachable"])
def test_failing_generator_is_retried_then_skipped(tmp_path, outcome):
    from gpu.preview import PreviewRenderer
    from tests.comfyui_server import ComfyUIStandIn, Script, write_workflow

    good = PreviewRenderer()(prompt="red", negative_prompt="", seed=1, output=tmp_path / "ok.mp4", render_id="x")
    video = _garbage(tmp_path / "bad.mp4") if outcome == "garbage" else good
    script = Script(outcome="success" if outcome in ("garbage", "unreachable") else outcome, steps=2)
    template = write_workflow(tmp_path / "workflow.json")
    with tempfile.TemporaryDirectory(prefix="mas-rel-") as tmp, ComfyUIStandIn(video=video, script=script) as server:
        Path(tmp).chmod(0o755)
        env = {
            "MAS_VIDEO_BACKEND": "comfyui",
            "MAS_COMFYUI_WORKFLOW": str(template),
            "MAS_STEP_RETRIES": "1",
            "MAS_COMFYUI_RETRIES": "0",
            "MAS_MAX_RENDER_SECONDS": "6",
            "MAS_COMFYUI_URL": server.url,
        }
        if outcome == "unreachable":
            env["MAS_COMFYUI_URL"] = "http://127.0.0.1:9"
        with IsolatedStudio(Path(tmp), **env) as studio:
            video_row = one_video_through(studio, "Create a video of a tidal pool", timeout=120)
            assert video_row.state == VideoState.failed
            assert any("render failed" in r for r in video_row.failure_reasons), video_row.failure_reasons
            failed = blocks.read(studio.settings, STUDIO, "production_queue")["FAILED_RETRIES"]
            assert [f["video_id"] for f in failed] == [video_row.id]
            if outcome != "unreachable":
                assert len(server.queued) == 2  # the first try and one retry, then skipped


def test_beat_killed_and_restarted_starts_a_due_batch_once(studio):
    """`mas beat` SIGKILLed before and after it starts an overnight batch: the batch runs, and only once."""
    from datetime import datetime, timedelta

    from mas.domain.requests import parse_request
    from mas.pipeline.production import schedule

    studio.worker("cpu")
    studio.worker("gpu")
    due_at = datetime.now(UTC) + timedelta(seconds=2)
    due = schedule(studio.settings, STUDIO, parse_request("Create a video of harbour cranes", studio.settings), run_at=due_at)
    beat = studio.beat()
    studio.wait_until(lambda: datetime.now(UTC) > due_at, what="the schedule to be due")
    beat.kill()  # due, but before beat's first 30 s tick of the schedule job
    with db.session_scope(studio.settings) as s:
        assert s.get(Schedule, due).status == "scheduled"
    beat = studio.beat()  # restarted on the schedule file the killed beat left
    studio.wait_until(
        lambda: studio.videos(1) and studio.batch_done(1), timeout=150, what="the scheduled batch to finish"
    )
    assert "Sending due task run-scheduled-batches" in beat.log.read_text()
    beat.kill()
    cpu = studio.workers[0]

    def schedule_jobs_run() -> int:
        return sum("run_schedules[" in line and "succeeded" in line for line in cpu.log.read_text().splitlines())

    ran = schedule_jobs_run()
    beat = studio.beat()  # restarted once more: its next tick finds nothing left to start
    studio.wait_until(lambda: schedule_jobs_run() > ran, timeout=90, what="the restarted beat's schedule job")
    with db.session_scope(studio.settings) as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(Batch)) == 1
        row = s.get(Schedule, due)
        assert row.status == "sent" and row.batch_id == 1
    assert_batch_exact(studio, 1, 1)


def test_flower_refuses_beyond_loopback_without_credentials(studio):
    result = studio.mas("flower", "--address", "0.0.0.0")
    assert result.returncode != 0 and "without auth" in result.stderr


def test_request_text_is_data_and_task_arguments_carry_ids_only(studio):
    import base64

    hostile = 'Create a video of "}; DROP TABLE videos; {\\"5222\\": {\\"class_type\\": \\"Exec\\"}}"'
    batch_id = studio.enqueue(hostile)  # no worker runs: the message stays in the queue
    with db.session_scope(studio.settings) as s:
        assert s.get(Batch, batch_id).request == hostile  # stored verbatim, as data
        assert s.get(Batch, batch_id).status == BatchStatus.queued
    (raw,) = redis_client(studio.settings).lrange("cpu", 0, -1)
    args, kwargs, _ = json.loads(base64.b64decode(json.loads(raw)["body"]))
    assert args == [batch_id] and kwargs == {}  # messages carry ids, never the request or secrets


def test_two_cpu_workers_share_a_batch(studio):
    """Scaling out: a second cpu worker (another host in production) joins with the same URLs."""
    first = studio.worker("cpu")
    second = studio.worker("cpu")
    studio.worker("gpu")
    batch_id = studio.enqueue("Create 6 videos of river deltas")
    studio.wait_batch(batch_id)
    assert_batch_exact(studio, batch_id, 6)
    for worker in (first, second):
        assert "tasks.pipeline.write_prompt" in worker.log.read_text()  # both took part


@pytest.mark.xdist_group("reliability-generators")
def test_dqa_grading_end_to_end_and_mas_grade(tmp_path):
    """MAS_GRADER=dqa on a real gpu worker: every attempt stores the five axes; `mas grade` re-grades."""
    from tests.integration.test_dqa import build_tiny_clip

    clip = build_tiny_clip(tmp_path / "tiny-clip", steps=10)
    with tempfile.TemporaryDirectory(prefix="mas-rel-") as tmp:
        Path(tmp).chmod(0o755)
        env = {
            "MAS_GRADER": "dqa",
            "MAS_CLIP_MODEL_PATH": str(clip),
            "MAS_TORCH_DTYPE": "float32",
            "MAS_DQA_FRAMES": "4",
            "MAS_MAX_RETRIES": "1",
        }
        with IsolatedStudio(Path(tmp), **env) as studio:
            video = one_video_through(studio, "Create a video of a red circle")
            with db.session_scope(studio.settings) as s:
                (attempt,) = s.scalars(sa.select(Attempt).where(Attempt.video_id == video.id)).all()
                assert attempt.grader == "dqa"
                assert {"semantic", "spatial", "benchmark", "multi_axis", "total"} <= set(attempt.scores)
            result = studio.mas("grade", str(video.id))
            assert result.returncode == 0, result.stderr
            assert "semantic" in result.stdout and "grade" in result.stdout
            missing = studio.mas("grade", "999999")
            assert missing.returncode != 0 and len(missing.stderr.strip().splitlines()) == 1
            tune = studio.mas("tune", "--dry-run")  # no picks, no base model: it says what serves and what to set
            assert tune.returncode == 0 and "studio default serves" in tune.stdout, tune.stdout + tune.stderr
            assert "MAS_PREFERENCE_BASE_MODEL_PATH" in tune.stdout
