"""Where a batch starts: its plan stored as videos, and the listeners it hands the start to.

`plan_batch` asks the Director with no transaction open, then calls `start` in one transaction with the batch
locked: the videos are made, the batch runs, and every listener writes its change in the same transaction (its
series, its A/B test, the event log, the production blocks), so all of it commits together or not at all. What
must wait for the commit (the first videos to send) comes back in the `Starting`, run once the transaction is
over; the end of a video works the same way (`mas.pipeline.ending`).

A new concern of a batch's start is one listener added to `LISTENERS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from celery import Celery
from sqlalchemy.orm import Session

from mas.config import Settings
from mas.domain.identity import Actor
from mas.domain.plans import Plan
from mas.domain.requests import ProductionRequest
from mas.domain.steps import StepPayload
from mas.memory import blocks
from mas.models import ABTest, ABVariation, Batch, BatchStatus, Series, Video
from mas.names import Priority
from mas.outbox import eventlog
from mas.pipeline import pacing
from mas.pipeline.chains import send_released
from mas.pipeline.ending import AfterCommit
from mas.pipeline.production import batch_priority


@dataclass(frozen=True)
class Started:
    """A batch's start as a listener sees it, inside the transaction that stored its plan."""

    settings: Settings
    session: Session
    batch: Batch
    """Locked for update, now running."""
    request: ProductionRequest
    plan: Plan
    videos: list[Video]
    """Made and flushed (their ids known), in the plan's order."""
    priority: Priority

    @property
    def actor(self) -> Actor:
        """Whom the batch is made for: its user (whose blocks a listener writes)."""
        return Actor(self.batch.user_name)

    @property
    def video_ids(self) -> list[int]:
        return [video.id for video in self.videos]


Listener = Callable[[Started], AfterCommit | None]


@dataclass
class Starting:
    """What a batch's start leaves to do once its transaction has committed."""

    video_ids: list[int]
    after_commit: list[AfterCommit] = field(default_factory=list)

    def run(self, app: Celery) -> None:
        for action in self.after_commit:
            action(app)


def start(
    settings: Settings,
    session: Session,
    batch: Batch,
    request: ProductionRequest,
    plan: Plan,
    *,
    style: dict[str, Any],
) -> Starting:
    """Store `plan` for the locked, still queued `batch`: its videos, the style its prompts are written against,
    and every listener's change, in the caller's transaction."""
    priority = batch_priority(batch)
    batch.style = style
    videos = [
        Video(
            batch_id=batch.id,
            position=position,
            concept=planned.concept,
            label=planned.label,
            state=pacing.first_state(priority),
        )
        for position, planned in enumerate(plan.videos, start=1)
    ]
    session.add_all(videos)
    session.flush()
    batch.status = BatchStatus.running
    started = Started(settings, session, batch, request, plan, videos, priority)
    actions = [action for listener in LISTENERS if (action := listener(started)) is not None]
    return Starting(started.video_ids, actions)


# --- the listeners ----------------------------------------------------------------------------------------


def series_membership(started: Started) -> None:
    """A series batch continues its series (made on its first batch, its style kept from its first plan), and
    `current_series` shows it."""
    request, batch, plan = started.request, started.batch, started.plan
    if request.kind != "series":
        return
    name = request.series_name or request.theme
    mine = sa.select(Series).where(Series.name == name, Series.user_name == batch.user_name)
    series = started.session.execute(mine.with_for_update()).scalar_one_or_none()
    if series is None:
        series = Series(name=name, user_name=batch.user_name, theme=request.theme, episodes_planned=0,
                        episodes_completed=0)  # fmt: skip
        started.session.add(series)
        started.session.flush()
    series.style = series.style or plan.series_style
    series.consistency_rules = series.consistency_rules or plan.consistency_rules
    series.elements = series.elements or plan.series_elements
    series.episodes_planned += len(plan.videos)
    batch.series_id = series.id
    blocks.update(
        started.settings,
        started.actor,
        "current_series",
        {
            "ACTIVE_SERIES": series.name,
            "SERIES_THEME": series.theme,
            "SERIES_STYLE": series.style,
            "EPISODES_PLANNED": series.episodes_planned,
            "EPISODES_COMPLETED": series.episodes_completed,
            "SERIES_ELEMENTS": series.elements,
            "CONSISTENCY_RULES": series.consistency_rules,
        },
        by="director",
        session=started.session,
    )


def ab_test(started: Started) -> None:
    """An A/B batch's videos are the variations of its test, which `ab_testing` shows."""
    if started.request.kind != "ab":
        return
    batch, session = started.batch, started.session
    test = ABTest(concept=started.request.theme, user_name=batch.user_name)
    session.add(test)
    session.flush()
    batch.ab_test_id = test.id
    pairs = list(zip(started.videos, started.plan.videos))
    for video, planned in pairs:
        session.add(ABVariation(test_id=test.id, label=planned.label, approach=planned.approach, video_id=video.id))
    blocks.update(
        started.settings,
        started.actor,
        "ab_testing",
        {
            "ACTIVE_TEST": str(test.id),
            "VARIATIONS": [{"label": p.label, "video_id": v.id, "approach": p.approach} for v, p in pairs],
            "VARIATION_A_ID": str(pairs[0][0].id),
            "VARIATION_B_ID": str(pairs[1][0].id),
        },
        by="director",
        session=session,
    )


def planned_event(started: Started) -> None:
    """The event log's `batch.planned`: the videos, the state they start in, the style applied."""
    eventlog.batch_changed(
        started.session,
        "batch.planned",
        started.batch,
        videos=started.video_ids,
        state=pacing.first_state(started.priority).value,
        style=started.batch.style,
    )


def production_queue_block(started: Started) -> None:
    """The Director's `production_queue`: this batch is the active one, its videos pending."""
    video_ids = started.video_ids
    blocks.update(
        started.settings,
        started.actor,
        "production_queue",
        {
            "QUEUE_STATUS": "active",
            "BATCH_ID": str(started.batch.id),
            "BATCH_TOTAL": len(video_ids),
            "BATCH_COMPLETE": 0,
            "PENDING_VIDEOS": video_ids[: blocks.PENDING_SHOWN],
            "IN_PROGRESS": None,
        },
        by="director",
        session=started.session,
    )


def session_state_block(started: Started) -> None:
    """The Director's `session_state`: the batch is the project in progress and pending work."""
    batch, video_ids = started.batch, started.video_ids
    blocks.update(
        started.settings,
        started.actor,
        "session_state",
        lambda v: {
            "LAST_ACTIVITY": blocks.now_iso(),
            "IN_PROGRESS_PROJECT": f"batch {batch.id}: {batch.request}",
            "PENDING_WORK": [
                *[w for w in v["PENDING_WORK"] if w.get("batch_id") != batch.id][-blocks.KEEP :],
                {"batch_id": batch.id, "request": batch.request},
            ],
            "QUEUED_VIDEOS": video_ids[: blocks.PENDING_SHOWN],
        },
        by="director",
        session=started.session,
    )


def first_videos(started: Started) -> AfterCommit:
    """The videos that start now: all of an urgent batch's, and the first ones the GPUs need of a normal one."""
    started.session.flush()
    released: pacing.Released = [
        (StepPayload(video_id=v, attempt=1), started.priority) for v in started.video_ids if started.priority == "high"
    ]
    released += pacing.release(started.settings, started.session)
    return lambda app: send_released(app, released)


LISTENERS: tuple[Listener, ...] = (
    series_membership,
    ab_test,
    planned_event,
    production_queue_block,
    session_state_block,
    first_videos,
)
"""What a batch's start sets off, in this order, in the transaction that stores its plan (the series first: the
event and the blocks read the batch it links)."""
