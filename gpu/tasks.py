"""The gpu queue's pipeline steps: render an attempt, then grade it; `mas grade` and the Tuner.

A gpu worker runs 1 + MAS_GPU_LOOKAHEAD of these at once, in threads (`mas.runtime.processes`): work on this
process's GPU takes a turn (`gpu.turns`), so the next task is ready when the GPU frees; a ComfyUI render
takes no turn, because ComfyUI's own queue is the line: the next prompt already waits there, ranked by
priority and arrival (`gpu.turns.rank`), and the download, checks and database writes of one render
happen while ComfyUI runs the next.

Both are steps of `mas.domain.steps`, run by `mas.pipeline.runner` like the cpu steps (lease, guard,
work with no transaction open, record and move on): a render redelivered after its worker died (state still
`rendering`) renders again under the attempt's stored render id (a ComfyUI render re-attaches to its
prompt). A render writes to a scratch file unique to its lease and moves it into place once it plays; a
cancelled video's render stops itself and the worker stays.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from functools import partial

import sqlalchemy as sa
from celery import shared_task
from celery.exceptions import Ignore
from celery.signals import task_postrun
from sqlalchemy.orm import Session

from gpu.factory import gpu_turns, grader, residency, video_backend
from gpu.interfaces import RenderStopped
from gpu.progress import ProgressPublisher
from gpu.turns import Turn, rank
from mas import names
from mas.db import session_scope
from mas.domain.identity import Actor
from mas.domain.steps import BY_NAME
from mas.errors import RetryableError
from mas.models import Attempt, Video
from mas.pipeline import rows, states
from mas.pipeline.runner import Outcome, StepRun, priority_of, step_task
from mas.runtime.clients import redis_client
from mas.runtime.failover import DATABASE_AWAY
from mas.storage import local_copy, storage, video_key
from mas.video import VideoUnreadable, check_video

log = logging.getLogger(__name__)


@shared_task(name=names.REGRADE, bind=True)
def regrade(self, video_id: int) -> dict:
    """`mas grade VIDEO`: grade a video again with DQA, per axis, on the GPU worker (writes nothing)."""
    from gpu.dqa import regrade as dqa_regrade

    settings = self.app.settings
    with gpu_turns(settings).turn(
        what=f"regrade of video {video_id}", priority="high", limit_seconds=settings.gpu.regrade_max_seconds
    ):
        return asdict(dqa_regrade(settings, video_id, residency=residency(settings)))


@shared_task(name=names.TUNE, bind=True)
def tune(self, dry_run: bool = False, user: str | None = None) -> dict:
    """The Tuner (nightly from beat, or `mas tune`), on the GPU worker: each user's pairwise taste and DPO
    adapter from their A/B choices. `user` tunes that user; None (the beat job) every user with picks. Only
    DPO training takes a GPU turn; the taste fit (CPU) lets renders go on."""
    from gpu.tuner import tune as run_tuner
    from mas.learning.promotion import users_with_picks

    settings = self.app.settings

    def tune_one(name: str) -> dict:
        turn = partial(
            gpu_turns(settings).turn,
            what=f"DPO training for {name}",
            priority=priority_of(self),
            limit_seconds=settings.gpu.tune_max_seconds,
        )
        report = run_tuner(settings, Actor(name), dry_run=dry_run, gpu_turn=turn)
        log.info("tune %s: %s%s", name, report.taste.reason + " " if report.taste else "", report.reason)
        return asdict(report)

    if user:
        return {"reports": [tune_one(user)], "failed": {}}
    # every user, one at a time: a user whose picks cannot be used is marked and skipped, the others tuned
    ran = rows.each(settings, TUNING_JOB, users_with_picks(settings), tune_one)
    return {"reports": list(ran.done.values()), "failed": ran.failed}


TUNING_JOB = "tuning"
"""The nightly tune in `mas.pipeline.rows`: one user's tune that fails is marked, tried again, then parked."""


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
        "device": settings.gpu.device or "default",
        "residency": asdict(residency(settings).stats()) if "gpu.residency" in sys.modules else None,
        "turns": turns.taken,
        "busy_seconds": turns.held_seconds,
        "recent_turns": list(turns.busy)[-RECENT_TURNS:],
        "published_at": time.time(),
    }
    key = names.gpu_stats_key(sender.request.hostname or "gpu")
    redis_client(settings).set(key, json.dumps(stats, default=str), ex=7 * 86_400)


class RenderTimedOut(RetryableError):
    """An in-process render used its GPU turn's whole time (MAS_MAX_RENDER_SECONDS) and was stopped."""


class RenderUnplayable(RetryableError):
    """The backend finished but its file does not play. The file is beyond repair (`VideoUnreadable`), the
    render is not: like any failed render it is tried again, and a new render may write a good file."""


@dataclass(frozen=True, kw_only=True)
class RenderJob:
    prompt: str
    negative_prompt: str
    seed: int
    render_id: str
    key: str
    """The attempt's file in the storage (`mas.storage.video_key`): a name we choose."""
    batch_id: int


@dataclass(frozen=True, kw_only=True)
class Rendered:
    location: str
    """Where the storage keeps the file (what the database records)."""
    seconds: float


class Render:
    """Render the attempt's prompt to an mp4."""

    def prepare(self, run: StepRun, session: Session, video: Video) -> RenderJob:
        row = states.attempt_row(session, video.id, run.attempt)
        # stored before the render starts: a render started again after a crash finds the same job
        row.render_id = row.render_id or str(uuid.uuid4())
        return RenderJob(
            prompt=row.prompt,
            negative_prompt=row.negative_prompt,
            seed=row.seed,
            render_id=row.render_id,
            key=video_key(batch_id=video.batch_id, video_id=video.id, attempt=run.attempt),
            batch_id=video.batch_id,
        )

    def work(self, run: StepRun, job: RenderJob) -> Rendered:
        settings = run.settings
        store = storage(settings)
        target = store.staging(job.key)
        scratch = target.with_name(f"{target.stem}.{run.lease.key}.partial.mp4")  # unique per run: never shared
        backend = video_backend(settings)
        cancelled = _stop_when_cancelled(settings, run.video_id)
        progress = ProgressPublisher(run, batch_id=job.batch_id)
        what = f"render of video {run.video_id} attempt {run.attempt}"
        started = time.monotonic()
        turn: Turn | None = None
        try:
            render = partial(
                backend,
                prompt=job.prompt,
                negative_prompt=job.negative_prompt,
                seed=job.seed,
                output=scratch,
                render_id=job.render_id,
                progress=progress.publish,
            )
            if backend.uses_this_gpu:
                with gpu_turns(settings).turn(
                    what=what, priority=run.priority, limit_seconds=settings.gpu.max_render_seconds
                ) as turn:
                    started = time.monotonic()
                    path = render(should_stop=lambda: turn.expired() or cancelled())
            else:  # the render server's queue is the line: this prompt waits there behind the running one
                order = rank(run.priority, head_start_seconds=settings.scheduling.priority_head_start_seconds)
                path = render(should_stop=cancelled, order=order)
            check_video(path)  # read the first frame back, so a garbage file fails its render, not the grading
            os.replace(path, target)
        except RenderStopped:
            if turn is not None and turn.expired():
                raise RenderTimedOut(
                    f"the {what} ran past MAS_MAX_RENDER_SECONDS ({settings.gpu.max_render_seconds} s) and was stopped"
                ) from None
            log.info("%s stopped: the video was cancelled", what)
            raise Ignore() from None
        except VideoUnreadable as exc:
            _forget_render(settings, run.video_id, run.attempt)  # the next try renders anew, not this file
            raise RenderUnplayable(
                f"the {settings.video.backend} backend wrote a file that does not play: {exc}"
            ) from exc
        finally:
            progress.close()
            scratch.unlink(missing_ok=True)
        seconds = backend.last_run_seconds or time.monotonic() - started  # a queued render: its server's record
        log.info("%s rendered in %.1f s", what, seconds)
        return Rendered(location=store.put(target, job.key), seconds=seconds)

    def record(self, run: StepRun, session: Session, video: Video, rendered: Rendered) -> Outcome:
        row = states.attempt_row(session, video.id, run.attempt)
        row.output_path, row.render_seconds, row.backend = (
            rendered.location,
            rendered.seconds,
            run.settings.video.backend,
        )
        return Outcome(state=run.step.next_state)


generate_video = step_task(BY_NAME["render"], Render())


def _forget_render(settings, video_id: int, attempt: int) -> None:
    with session_scope(settings) as session:
        session.execute(
            sa.update(Attempt).where(Attempt.video_id == video_id, Attempt.number == attempt).values(render_id=None)
        )


def _stop_when_cancelled(settings, video_id: int, *, every_s: float = 1.0):
    """`should_stop` for a backend: True once the video is cancelled (asked of Postgres at most once a second).
    A database that does not answer (a restart, a failover) leaves the answer unknown and the render going on:
    its record waits for the database (`mas.pipeline.runner`), and a cancel is seen at the next answer."""
    asked_at, stop, away = 0.0, False, False

    def should_stop() -> bool:
        nonlocal asked_at, stop, away
        now = time.monotonic()
        if not stop and now - asked_at >= every_s:
            asked_at = now
            try:
                with session_scope(settings) as session:
                    stop = states.cancelled(session, video_id)
            except DATABASE_AWAY as exc:
                if not away:  # once per outage
                    log.warning("render of video %s goes on: cannot ask whether it was cancelled: %s", video_id, exc)
                away = True
            else:
                away = False
        return stop

    return should_stop


@dataclass(frozen=True, kw_only=True)
class GradingJob:
    location: str
    prompt: str
    concept: str


@dataclass(frozen=True, kw_only=True)
class Grading:
    scores: dict
    grade: str
    reasons: list[str]


class Grade:
    """Grade the rendered attempt and store its per-axis scores."""

    def prepare(self, run: StepRun, session: Session, video: Video) -> GradingJob:
        row = states.attempt_row(session, video.id, run.attempt)
        return GradingJob(location=row.output_path or "", prompt=row.prompt, concept=video.concept)

    def work(self, run: StepRun, job: GradingJob) -> Grading:
        what = f"grading of video {run.video_id} attempt {run.attempt}"
        try:
            path = local_copy(run.settings, job.location)  # before the turn: a download needs no GPU
            if path is None:
                raise VideoUnreadable(f"the rendered file {job.location!r} is not in the storage")
            with gpu_turns(run.settings).turn(
                what=what, priority=run.priority, limit_seconds=run.settings.gpu.max_render_seconds
            ):
                scores, grade = grader(run.settings)(
                    video=path, prompt=job.prompt, concept=job.concept, actor=run.actor
                )
        except VideoUnreadable as exc:  # a broken render is graded F, so review renders it again
            return Grading(scores={"total": 0.0}, grade="F", reasons=[str(exc)])
        return Grading(scores=scores, grade=grade, reasons=[])

    def record(self, run: StepRun, session: Session, video: Video, grading: Grading) -> Outcome:
        row = states.attempt_row(session, video.id, run.attempt)
        row.scores, row.grade, row.grader = grading.scores, grading.grade, run.settings.quality.grader
        row.failure_reasons, row.finished_at = grading.reasons, sa.func.now()
        return Outcome(state=run.step.next_state)


evaluate_video = step_task(BY_NAME["grade"], Grade())
