"""Where a video ends: the one move to a final state, and the listeners it hands the change to.

A video ends accepted (its review accepted it), failed (its review gave it up, or a step failed for good) or
cancelled (`mas cancel`). The runner ends it with `end`; a step's failure handler and control with `give_up`.
The move and every listener's change are written in the caller's transaction, so they commit together and
are exact however often a message is delivered. What must wait for the commit (messages to send) comes back
in the `Ending`, which the caller runs once its transaction is over.

A new concern of a video's end (a counter, a notification) is one listener added to `LISTENERS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from celery import Celery
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from mas import names
from mas.config import Settings
from mas.domain.identity import Actor
from mas.domain.states import TERMINAL, BatchStatus, VideoState
from mas.memory import blocks
from mas.models import AgentBuffer, Batch, Series, Video
from mas.outbox import events
from mas.pipeline import pacing, states
from mas.pipeline.chains import send_released

S = VideoState
AfterCommit = Callable[[Celery], None]


@dataclass(frozen=True)
class Ended:
    """A video's end as a listener sees it, inside the transaction that moved it."""

    settings: Settings
    session: Session
    video: Video
    batch: Batch
    """Its batch, locked for update."""
    was: VideoState
    """The live state it ended from."""
    batch_done: bool
    """It was the last live video of its running batch: the batch is done with it."""

    @property
    def actor(self) -> Actor:
        """Whom the video was made for: its batch's user (whose blocks a listener writes)."""
        return Actor(self.batch.user_name)


Listener = Callable[[Ended], AfterCommit | None]


@dataclass
class Ending:
    """What a video's end leaves to do once its transaction has committed."""

    after_commit: list[AfterCommit] = field(default_factory=list)

    def run(self, app: Celery) -> None:
        for action in self.after_commit:
            action(app)


def end(
    settings: Settings,
    session: Session,
    video_id: int,
    source: VideoState,
    target: VideoState,
    *,
    attempt: int,
    **values: Any,
) -> Ending | None:
    """Move a video from its step's state to a final one (the runner's move); None when it had moved on."""
    if target not in TERMINAL:
        raise ValueError(f"{target.value} is not a final state")
    if not states.transition(session, video_id, source, target, attempt=attempt, **values):
        return None
    return _hand_on(settings, session, video_id, was=source)


def give_up(
    settings: Settings,
    session: Session,
    video_id: int,
    target: VideoState,
    reason: str,
    *,
    at: tuple[VideoState, int] | None = None,
) -> Ending | None:
    """Fail or cancel a video from whatever live state it is in (or only from `at`: a state and an attempt),
    recording why; None when it is already final (or no longer at `at`)."""
    was = session.scalar(sa.select(Video.state).where(Video.id == video_id).with_for_update())
    moved = (
        states.cancel(session, video_id, reason)
        if target == S.cancelled
        else states.fail(session, video_id, reason, at=at)
    )
    if not moved or was is None:
        return None
    return _hand_on(settings, session, video_id, was=was)


def _hand_on(settings: Settings, session: Session, video_id: int, *, was: VideoState) -> Ending:
    video = session.get_one(Video, video_id)
    session.refresh(video)
    batch = session.execute(sa.select(Batch).where(Batch.id == video.batch_id).with_for_update()).scalar_one()
    live = session.scalar(
        sa.select(sa.func.count())
        .select_from(Video)
        .where(Video.batch_id == batch.id, Video.state.not_in(list(TERMINAL)))
    )
    ended = Ended(settings, session, video, batch, was, batch_done=not live and batch.status == BatchStatus.running)
    return Ending([action for listener in LISTENERS if (action := listener(ended)) is not None])


# --- the listeners ----------------------------------------------------------------------------------------


def batch_completion(ended: Ended) -> None:
    """The batch's last live video: the batch is done."""
    if ended.batch_done:
        ended.batch.status = BatchStatus.done
        ended.batch.updated_at = sa.func.now()


def production_queue_block(ended: Ended) -> None:
    """The Cameraman's `production_queue`: the video off IN_PROGRESS, counted, listed as completed or failed;
    the batch's QUEUE_STATUS complete when it is done."""
    video, batch = ended.video, ended.batch
    entry = {"video_id": video.id, "batch_id": batch.id, "grade": video.grade, "attempts": video.attempt_count}

    def change(v: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"IN_PROGRESS": None if v["IN_PROGRESS"] == str(video.id) else v["IN_PROGRESS"]}
        if v["BATCH_ID"] == str(batch.id):
            out["BATCH_COMPLETE"] = v["BATCH_COMPLETE"] + 1
            out["PENDING_VIDEOS"] = pending_videos(ended.session, batch.id)
            if ended.batch_done:
                out["QUEUE_STATUS"] = "complete"
        if video.state == S.accepted:
            out["COMPLETED_TODAY"] = (v["COMPLETED_TODAY"] + [entry])[-blocks.KEEP :]
        else:
            reasons = [r[:100] for r in video.failure_reasons[-2:]]
            out["FAILED_RETRIES"] = (v["FAILED_RETRIES"] + [{**entry, "reasons": reasons}])[-blocks.KEEP_FAILED :]
        return out

    blocks.update(ended.settings, ended.actor, "production_queue", change, by="cameraman", session=ended.session)


def session_state_block(ended: Ended) -> None:
    """The Director's `session_state`: a done batch is no longer pending work."""
    if not ended.batch_done:
        return
    batch_id = ended.batch.id
    blocks.update(
        ended.settings,
        ended.actor,
        "session_state",
        lambda v: {
            "PENDING_WORK": [w for w in v["PENDING_WORK"] if w.get("batch_id") != batch_id],
            "IN_PROGRESS_PROJECT": None,
            "QUEUED_VIDEOS": [],
            "LAST_ACTIVITY": blocks.now_iso(),
        },
        by="director",
        session=ended.session,
    )


def series_progress(ended: Ended) -> None:
    """An accepted episode counts on its series and in `current_series`."""
    if not ended.batch.series_id or ended.video.state != S.accepted:
        return
    series = ended.session.execute(
        sa.select(Series).where(Series.id == ended.batch.series_id).with_for_update()
    ).scalar_one()
    series.episodes_completed += 1
    blocks.update(
        ended.settings,
        ended.actor,
        "current_series",
        lambda v: {"EPISODES_COMPLETED": series.episodes_completed} if v["ACTIVE_SERIES"] == series.name else {},
        by="cameraman",
        session=ended.session,
    )


def outbox(ended: Ended) -> None:
    """The webhook events: the video's end, and the batch's when it is done (an A/B test's when it waits for
    a pick)."""
    video, batch, session, settings = ended.video, ended.batch, ended.session, ended.settings
    events.record(
        session,
        settings,
        type=f"video.{video.state.value}",  # type: ignore[arg-type]  # accepted, failed or cancelled
        batch=batch,
        data={
            "video_id": video.id,
            "concept": video.concept,
            "grade": video.grade,
            "attempts": video.attempt_count,
            "output": video.output_path,
            "failure_reasons": video.failure_reasons if video.state != S.accepted else [],
        },
    )
    if not ended.batch_done:
        return
    counts = dict(
        session.execute(
            sa.select(Video.state, sa.func.count()).where(Video.batch_id == batch.id).group_by(Video.state)
        ).all()
    )
    summary = {"total": batch.total, "accepted": counts.get(S.accepted, 0), "failed": counts.get(S.failed, 0)}
    events.record(session, settings, type="batch.done", batch=batch, data=summary)
    if batch.ab_test_id is not None:
        events.record(session, settings, type="ab.ready", batch=batch, data={"ab_test_id": batch.ab_test_id})


def interactions(ended: Ended) -> AfterCommit | None:
    """The Director's interaction count; every MAS_SLEEPTIME_FREQUENCY-th, a sleeptime consolidation."""
    count = ended.session.execute(
        pg_insert(AgentBuffer)
        .values(agent="director", summary="", failed_summaries=0, interactions=1)
        .on_conflict_do_update(index_elements=["agent"], set_={"interactions": AgentBuffer.interactions + 1})
        .returning(AgentBuffer.interactions)
    ).scalar_one()
    if count % ended.settings.memory.sleeptime_frequency:
        return None
    return lambda app: app.send_task(names.CONSOLIDATE)


def pacing_release(ended: Ended) -> AfterCommit | None:
    """A video that held a place ahead of the GPUs frees it: the next waiting ones are let through."""
    if not pacing.leaves_ahead(ended.was, ended.video.state):
        return None
    released = pacing.release(ended.settings, ended.session)
    return lambda app: send_released(app, released)


LISTENERS: tuple[Listener, ...] = (
    batch_completion,
    production_queue_block,
    session_state_block,
    series_progress,
    outbox,
    interactions,
    pacing_release,
)
"""What a video's end sets off, in this order, in the transaction of the move."""


def pending_videos(session: Session, batch_id: int) -> list[int]:
    """The next unfinished videos of a batch, as many as a core block comfortably holds."""
    return list(
        session.scalars(
            sa.select(Video.id)
            .where(Video.batch_id == batch_id, Video.state.not_in(list(TERMINAL)))
            .order_by(Video.position)
            .limit(blocks.PENDING_SHOWN)
        )
    )
