"""The gpu queue's pipeline steps: render an attempt, then grade it; `mas grade` and the Tuner.

A gpu worker runs 1 + MAS_GPU_LOOKAHEAD of these at once, in threads (`mas.processes`): work on this
process's GPU takes a turn (`gpu.turns`), so the next task is ready when the GPU frees; a ComfyUI render
takes no turn, because ComfyUI's own queue is the line: the next prompt already waits there, ranked by
priority and arrival (`gpu.turns.rank`), and the download, checks and database writes of one render
happen while ComfyUI runs the next.

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
from functools import partial
from pathlib import Path

import sqlalchemy as sa
from celery.exceptions import Ignore, Reject
from celery.signals import task_postrun

from gpu.factory import gpu_turns, grader, residency, video_backend
from gpu.interfaces import RenderStopped
from gpu.turns import Turn, rank
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


def priority_of(task) -> str:
    """high when the task came from an urgent queue."""
    queue = (task.request.delivery_info or {}).get("routing_key") or ""
    return "high" if names.is_urgent(queue) else "normal"


@app.task(name=names.REGRADE, bind=True)
def regrade(self, video_id: int) -> dict:
    """`mas grade VIDEO`: grade a video again with DQA, per axis, on the GPU worker (writes nothing)."""
    from gpu.dqa import regrade as dqa_regrade

    settings = self.app.settings
    with gpu_turns(settings).turn(what=f"regrade of video {video_id}", priority="high", limit_seconds=settings.regrade_max_seconds):
        return asdict(dqa_regrade(settings, video_id, residency=residency(settings)))


@app.task(name=names.TUNE, bind=True)
def tune(self, dry_run: bool = False, user: str | None = None) -> dict:
    """The Tuner (nightly from beat, or `mas tune`), on the GPU worker: each user's pairwise taste and DPO
    adapter from their A/B choices. `user` tunes that user; None (the beat job) every user with picks. Only
    DPO training takes a GPU turn; the taste fit (CPU) lets renders go on."""
    from gpu.tuner import tune as run_tuner
    from mas.taste_promotion import users_with_picks

    settings = self.app.settings
    reports = []
    for name in [user] if user else users_with_picks(settings):
        turn = partial(gpu_turns(settings).turn, what=f"DPO training for {name}", priority=priority_of(self),
                       limit_seconds=settings.tune_max_seconds)
        report = run_tuner(settings.for_user(name), dry_run=dry_run, gpu_turn=turn)
        log.info("tune %s: %s%s", name, report.taste.reason + " " if report.taste else "", report.reason)
        reports.append(asdict(report))
    return {"reports": reports}


RECENT_TURNS = 200
"""How many of the latest GPU turns a worker publishes (start and end times), for benchmarks and people."""


@task_postrun.connect
def publish_stats(sender=None, **_) -> None:
    """After each gpu task, publish this worker's model loads / evictions / swaps and its GPU turns, under
    the worker's own key, for `mas status` and Flower users."""
    if sender is None or not sender.name.startswith("gpu.") or "gpu.turns" not in sys.modules:
        return  # no task of this process has used the GPU yet
    settings = sender.app.settings
    turns = gpu_turns(settings)
    stats = {
        "worker": sender.request.hostname,
        "device": settings.gpu_device or "default",
        "residency": asdict(residency(settings).stats()) if "gpu.residency" in sys.modules else None,
        "turns": turns.taken,
        "busy_seconds": turns.held_seconds,
        "recent_turns": list(turns.busy)[-RECENT_TURNS:],
        "published_at": time.time(),
    }
    key = names.gpu_stats_key(sender.request.hostname or "gpu")
    redis_client(settings).set(key, json.dumps(stats, default=str), ex=7 * 86_400)


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


class RenderTimedOut(RetryableError):
    """An in-process render used its GPU turn's whole time (MAS_MAX_RENDER_SECONDS) and was stopped."""


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
    backend, priority = video_backend(settings), priority_of(task)
    cancelled = _stop_when_cancelled(settings, video_id)
    what = f"render of video {video_id} attempt {attempt}"
    started = time.monotonic()
    turn: Turn | None = None
    try:
        values = dict(prompt=prompt, negative_prompt=negative, seed=seed, output=scratch, render_id=render_id, progress=progress)
        if backend.uses_this_gpu:
            with gpu_turns(settings).turn(what=what, priority=priority, limit_seconds=settings.max_render_seconds) as turn:
                started = time.monotonic()
                path = backend(**values, should_stop=lambda: turn.expired() or cancelled())
        else:  # the render server's queue is the line: this prompt waits there behind the running one
            path = backend(**values, should_stop=cancelled, order=rank(priority, head_start_seconds=settings.priority_head_start_seconds))
        check_video(path)  # read the first frame back, so a garbage file fails its render, not the grading
        os.replace(path, target)
    except RenderStopped:
        if turn is not None and turn.expired():
            raise RenderTimedOut(f"the {what} ran past MAS_MAX_RENDER_SECONDS ({settings.max_render_seconds} s) and was stopped") from None
        log.info("%s stopped: the video was cancelled", what)
        raise Ignore() from None
    except VideoUnreadable as exc:
        _forget_render(settings, video_id, attempt)  # the next try renders anew instead of fetching this file
        raise RenderUnplayable(f"the {settings.video_backend} backend wrote a file that does not play: {exc}") from exc
    finally:
        scratch.unlink(missing_ok=True)
    seconds = backend.last_run_seconds or time.monotonic() - started  # a queued render: its server's record
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
        return _grade(settings, payload, priority_of(self))


def _grade(settings, payload: dict, priority: str) -> dict:
    video_id, attempt = payload["video_id"], payload["attempt"]
    with session_scope(settings) as session:
        if states.at_step(session, video_id, S.evaluating, attempt) is None or not states.steps_may_run(session, video_id):
            raise Ignore()
        row = states.attempt_row(session, video_id, attempt)
        if row.grade is not None:
            return payload
        path, prompt, concept = Path(row.output_path), row.prompt, row.video.concept
        user = row.video.batch.user_name
    reasons: list[str] = []
    try:
        what = f"grading of video {video_id} attempt {attempt}"
        with gpu_turns(settings).turn(what=what, priority=priority, limit_seconds=settings.max_render_seconds):
            scores, grade = grader(settings)(video=path, prompt=prompt, concept=concept, user=user)
    except VideoUnreadable as exc:  # a broken render is graded F, so review renders it again
        scores, grade, reasons = {"total": 0.0}, "F", [str(exc)]
    with session_scope(settings) as session:
        session.execute(
            sa.update(Attempt).where(Attempt.video_id == video_id, Attempt.number == attempt, Attempt.grade.is_(None))
            .values(scores=scores, grade=grade, grader=settings.grader, failure_reasons=reasons, finished_at=sa.func.now())
        )
    return {**payload, "grade": grade}
