"""The gpu queue's pipeline steps: render an attempt, then grade it.

Both hold the step's lease (`mas.leases`) while they run, so a second delivery of a running step leaves
it alone, and both are guarded like the cpu steps: a render redelivered after its worker died (state
still `generating`) renders again under the attempt's stored render id (a ComfyUI render re-attaches to
its prompt); a step whose work is already committed passes the payload on; anything further along, or a
paused or cancelled batch, stops the chain. A render writes to a scratch file unique to its lease and
moves it into place once it plays; a cancelled video's render stops itself and the worker stays.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import uuid
from dataclasses import asdict
from pathlib import Path

import sqlalchemy as sa
from celery.exceptions import Ignore, Reject
from celery.signals import task_postrun

from gpu.factory import grader, residency, video_backend
from gpu.interfaces import RenderStopped
from mas import leases, names, states
from mas.celery_app import app
from mas.clients import redis_client
from mas.db import session_scope
from mas.errors import PermanentError, RetryableError
from mas.models import Attempt, Video, VideoState
from mas.outcomes import fail_on_error
from mas.video import VideoUnreadable, check_video

S = VideoState
log = logging.getLogger(__name__)


@app.task(name=names.REGRADE, bind=True)
def regrade(self, video_id: int) -> dict:
    """`mas grade VIDEO`: grade a video again with DQA, per axis, on the GPU worker (writes nothing)."""
    from gpu.dqa import regrade as dqa_regrade

    settings = self.app.settings
    return asdict(dqa_regrade(settings, video_id, residency=residency(settings)))


@app.task(name=names.TUNE, bind=True)
def tune(self, dry_run: bool = False) -> dict:
    """The Tuner: DPO on the user's A/B choices (nightly from beat, or `mas tune`), on the GPU worker."""
    from gpu.tuner import tune as run_tuner

    report = run_tuner(self.app.settings, dry_run=dry_run)
    log.info("tune: %s", report.reason)
    return asdict(report)


@task_postrun.connect
def publish_residency(sender=None, **_) -> None:
    """After each gpu task, publish model loads / evictions / swaps for `mas status` and Flower users."""
    if sender is None or not sender.name.startswith("gpu.") or "gpu.residency" not in sys.modules:
        return  # no task of this process has used a model yet
    stats = residency(sender.app.settings).stats()
    redis_client(sender.app.settings).set(names.GPU_STATS_KEY, json.dumps(asdict(stats), default=str))


def output_path(settings, video: Video, attempt: int) -> Path:
    """Where an attempt's video goes: a name we choose, inside the output folder."""
    return settings.videos_dir / f"batch-{video.batch_id}" / f"video-{video.id}-attempt-{attempt}.mp4"


STEP_OPTIONS = dict(
    bind=True,
    on_failure=fail_on_error,
    # a generator or grader that fails, hangs (soft time limit) or answers garbage is retried a few
    # times, then the video is skipped with the reason; a PermanentError (a missing model, a refused
    # workflow, invalid settings) would fail the same way again, so it skips the video at once; Ignore
    # means a duplicate delivery, not an error
    autoretry_for=(Exception,),
    dont_autoretry_for=(Ignore, Reject, PermanentError),
    max_retries=app.settings.step_retries,
    time_limit=app.settings.max_render_seconds,
    soft_time_limit=int(app.settings.max_render_seconds * 0.97),
)


class RenderUnplayable(RetryableError):
    """The backend finished but its file does not play. The file is beyond repair (`VideoUnreadable`), the
    render is not: like any failed render it is tried again, and a new render may write a good file."""


@app.task(name=names.GENERATE_VIDEO, **STEP_OPTIONS)
def generate_video(self, payload: dict) -> dict:
    """Render the attempt's prompt to an mp4."""
    settings = self.app.settings
    with leases.hold_step(settings, video_id=payload["video_id"], attempt=payload["attempt"], step="render") as lease:
        return _render(self, settings, payload, lease)


def _render(task, settings, payload: dict, lease: leases.Lease) -> dict:
    video_id, attempt = payload["video_id"], payload["attempt"]
    with session_scope(settings) as session:
        video = session.execute(sa.select(Video).where(Video.id == video_id).with_for_update()).scalar_one_or_none()
        if video is None or video.attempt_count != attempt or video.state not in (S.writing, S.generating, S.evaluating):
            raise Ignore()
        if video.state == S.evaluating:
            return payload  # rendered before; the next message was never sent
        if not states.steps_may_run(session, video_id):
            raise Ignore()
        if video.state == S.writing:
            states.transition(session, video_id, S.writing, S.generating, attempt=attempt)
        row = states.attempt_row(session, video_id, attempt)
        # stored before the render starts: a render started again after a crash finds the same job
        row.render_id = row.render_id or str(uuid.uuid4())
        prompt, negative, seed, render_id = row.prompt, row.negative_prompt, row.seed, row.render_id
        target = output_path(settings, video, attempt)

    def progress(done: int, total: int) -> None:
        task.update_state(state="PROGRESS", meta={**payload, "step": "rendering", "done": done, "total": total})

    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = target.with_name(f"{target.stem}.{lease.key}.partial.mp4")  # unique per run: never shared
    started = time.monotonic()
    try:
        path = video_backend(settings)(
            prompt=prompt, negative_prompt=negative, seed=seed, output=scratch, render_id=render_id,
            progress=progress, should_stop=_stop_when_cancelled(settings, video_id),
        )
        check_video(path)  # read the first frame back, so a garbage file fails its render, not the grading
        os.replace(path, target)
    except RenderStopped:
        log.info("render of video %s attempt %s stopped: the video was cancelled", video_id, attempt)
        raise Ignore() from None
    except VideoUnreadable as exc:
        _forget_render(settings, video_id, attempt)  # the next try renders anew instead of fetching this file
        raise RenderUnplayable(f"the {settings.video_backend} backend wrote a file that does not play: {exc}") from exc
    finally:
        scratch.unlink(missing_ok=True)
    seconds = time.monotonic() - started
    with session_scope(settings) as session:
        if not states.transition(session, video_id, S.generating, S.evaluating, attempt=attempt):
            raise Ignore()  # cancelled (or failed) meanwhile: the chain stops here
        session.execute(
            sa.update(Attempt).where(Attempt.video_id == video_id, Attempt.number == attempt)
            .values(output_path=str(target), render_seconds=seconds, backend=settings.video_backend)
        )
    return payload


def _forget_render(settings, video_id: int, attempt: int) -> None:
    with session_scope(settings) as session:
        session.execute(
            sa.update(Attempt).where(Attempt.video_id == video_id, Attempt.number == attempt).values(render_id=None)
        )


def _stop_when_cancelled(settings, video_id: int, *, every_s: float = 1.0):
    """`should_stop` for a backend: True once the video is cancelled (asked of Postgres at most once a second)."""
    last = {"at": 0.0, "stop": False}

    def should_stop() -> bool:
        now = time.monotonic()
        if not last["stop"] and now - last["at"] >= every_s:
            last["at"] = now
            with session_scope(settings) as session:
                last["stop"] = states.cancelled(session, video_id)
        return last["stop"]

    return should_stop


@app.task(name=names.EVALUATE_VIDEO, **STEP_OPTIONS)
def evaluate_video(self, payload: dict) -> dict:
    """Grade the rendered attempt and store its per-axis scores."""
    settings = self.app.settings
    with leases.hold_step(settings, video_id=payload["video_id"], attempt=payload["attempt"], step="grade"):
        return _grade(settings, payload)


def _grade(settings, payload: dict) -> dict:
    video_id, attempt = payload["video_id"], payload["attempt"]
    with session_scope(settings) as session:
        if states.at_step(session, video_id, S.evaluating, attempt) is None or not states.steps_may_run(session, video_id):
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
