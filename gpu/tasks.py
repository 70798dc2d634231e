"""The gpu queue's pipeline steps: render an attempt, then grade it.

Both are guarded like the cpu steps: a render redelivered after its worker died (state still
`generating`, no output yet) renders again; a step whose work is already committed passes the payload on;
anything further along stops the chain.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path

import imageio_ffmpeg
import sqlalchemy as sa
from celery.exceptions import Ignore, Reject
from celery.signals import task_postrun

from gpu.backends import video_backend
from mas import services, states
from mas.celery_app import GPU_STATS_KEY, app
from mas.db import session_scope
from mas.models import Attempt, Video, VideoState
from mas.grading import ModelMissing, VideoUnreadable
from mas.outcomes import fail_on_delivery_cap, fail_on_error

S = VideoState
log = logging.getLogger(__name__)


@app.task(name="gpu.tasks.regrade", bind=True)
def regrade(self, video_id: int) -> dict:
    """`mas grade VIDEO`: grade a video again with DQA, per axis, on the GPU worker (writes nothing)."""
    from dataclasses import asdict

    from gpu.dqa import regrade as dqa_regrade
    from gpu.residency import residency

    settings = self.app.settings
    return asdict(dqa_regrade(settings, video_id, residency=residency(settings)))


@app.task(name="gpu.tasks.tune", bind=True)
def tune(self, dry_run: bool = False) -> dict:
    """The Tuner: DPO on the user's A/B choices (nightly from beat, or `mas tune`), on the GPU worker."""
    from dataclasses import asdict

    from gpu.tuner import tune as run_tuner

    report = run_tuner(self.app.settings, dry_run=dry_run)
    log.info("tune: %s", report.reason)
    return asdict(report)


@task_postrun.connect
def publish_residency(sender=None, **_) -> None:
    """After each gpu task, publish model loads / evictions / swaps for `mas status` and Flower users."""
    if sender is None or not sender.name.startswith("gpu.") or "gpu.residency" not in sys.modules:
        return
    from gpu.residency import residency

    stats = residency(sender.app.settings).stats()
    services.redis_client(sender.app.settings).set(GPU_STATS_KEY, json.dumps(asdict(stats), default=str))


def grader(settings):
    """The grader named by MAS_GRADER: the offline preview stand-in, or DQA."""
    if settings.grader == "dqa":
        from gpu.dqa import DQAGrader
        from gpu.residency import residency

        return DQAGrader(settings=settings, residency=residency(settings))
    from gpu.preview import PreviewGrader

    return PreviewGrader()


def output_path(settings, video: Video, attempt: int) -> Path:
    """Where an attempt's video goes: a name we choose, inside the output folder."""
    return settings.videos_dir / f"batch-{video.batch_id}" / f"video-{video.id}-attempt-{attempt}.mp4"


STEP_OPTIONS = dict(
    bind=True,
    on_delivery_cap=fail_on_delivery_cap,
    on_failure=fail_on_error,
    # a generator or grader that fails, hangs (soft time limit) or answers garbage is retried a few
    # times, then the video is skipped with the reason; Ignore means a duplicate delivery, not an error
    autoretry_for=(Exception,),
    dont_autoretry_for=(Ignore, Reject, ModelMissing),
    max_retries=app.settings.step_retries,
    time_limit=app.settings.max_render_seconds,
    soft_time_limit=int(app.settings.max_render_seconds * 0.97),
)


class UnusableVideo(RuntimeError):
    """The generator's output is not a playable video."""


def check_video(path: Path) -> None:
    """Read the first frame back, so a garbage file fails its render, not the grading after it."""
    try:
        reader = imageio_ffmpeg.read_frames(str(path))
        meta = next(reader)
        first = next(reader, None)
        reader.close()
    except (RuntimeError, OSError, StopIteration) as exc:
        raise UnusableVideo(f"{path.name} does not decode: {exc}") from exc
    if first is None or not meta.get("size"):
        raise UnusableVideo(f"{path.name} holds no frames")


@app.task(name="gpu.tasks.generate_video", **STEP_OPTIONS)
def generate_video(self, payload: dict) -> dict:
    """Render the attempt's prompt to an mp4."""
    settings = self.app.settings
    video_id, attempt = payload["video_id"], payload["attempt"]
    with session_scope(settings) as session:
        video = session.execute(sa.select(Video).where(Video.id == video_id).with_for_update()).scalar_one_or_none()
        if video is None or video.attempt_count != attempt or video.state not in (S.writing, S.generating, S.evaluating):
            raise Ignore()
        if video.state == S.evaluating:
            return payload  # rendered before; the next message was never sent
        if video.state == S.writing:
            states.transition(session, video_id, S.writing, S.generating, attempt=attempt)
        row = states.attempt_row(session, video_id, attempt)
        prompt, negative, seed = row.prompt, row.negative_prompt, row.seed
        target = output_path(settings, video, attempt)

    def progress(done: int, total: int) -> None:
        self.update_state(state="PROGRESS", meta={**payload, "step": "rendering", "done": done, "total": total})

    started = time.monotonic()
    # revoke(terminate=True) sends SIGTERM: exit through the backend so it stops the render it started
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        path = video_backend(settings)(
            prompt=prompt, negative_prompt=negative, seed=seed, output=target, progress=progress
        )
    finally:
        signal.signal(signal.SIGTERM, previous)
    check_video(path)
    seconds = time.monotonic() - started
    with session_scope(settings) as session:
        moved = states.transition(session, video_id, S.generating, S.evaluating, attempt=attempt)
        if moved:
            session.execute(
                sa.update(Attempt).where(Attempt.video_id == video_id, Attempt.number == attempt)
                .values(output_path=str(path), render_seconds=seconds, backend=settings.video_backend)
            )
    return payload


@app.task(name="gpu.tasks.evaluate_video", **STEP_OPTIONS)
def evaluate_video(self, payload: dict) -> dict:
    """Grade the rendered attempt and store its per-axis scores."""
    settings = self.app.settings
    video_id, attempt = payload["video_id"], payload["attempt"]
    with session_scope(settings) as session:
        if states.at_step(session, video_id, S.evaluating, attempt) is None:
            raise Ignore()
        row = states.attempt_row(session, video_id, attempt)
        if row.grade is not None:
            return payload
        path, prompt, concept = Path(row.output_path), row.prompt, row.video.concept
    reasons: list[str] = []
    try:
        scores, grade = grader(settings)(video=path, prompt=prompt, concept=concept)
    except VideoUnreadable as exc:  # a broken render is graded F, so review renders it again
        scores, grade, reasons = {"total": 0.0}, "F", [str(exc)]
    with session_scope(settings) as session:
        session.execute(
            sa.update(Attempt).where(Attempt.video_id == video_id, Attempt.number == attempt, Attempt.grade.is_(None))
            .values(scores=scores, grade=grade, grader=settings.grader, failure_reasons=reasons, finished_at=sa.func.now())
        )
    return {**payload, "grade": grade}
