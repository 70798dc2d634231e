"""How a step or a plan that failed for good ends its video or its batch, and which failures are not
failures (a lost connection: the step is sent again). A video's end itself is `mas.pipeline.ending`."""

from __future__ import annotations

import logging
from typing import Any

import redis
import sqlalchemy as sa
from billiard.einfo import ExceptionInfo
from celery import Task
from kombu.exceptions import OperationalError as BrokerUnreachable

from mas.config import Settings
from mas.db import rows_changed, session_scope
from mas.domain.steps import StepPayload
from mas.errors import PeerUnavailable
from mas.models import (
    Attempt,
    Batch,
    BatchStatus,
    VideoState,
)
from mas.outbox import events
from mas.pipeline import ending
from mas.pipeline.leases import LeaseHeld
from mas.redaction import redact_text

log = logging.getLogger(__name__)
S = VideoState
LOST_CONNECTION = (redis.ConnectionError, redis.TimeoutError, BrokerUnreachable)
"""A step that ends on one of these lost its connection to the broker (Redis restarting, a network cut): it is
not the video's fault. The video is left as it is; its lease ends, and reconcile sends the step again (a step
that keeps failing so is given up by its lease's claim count, with the reason). So is a step that kept finding
its lease held (`LeaseHeld`). A database that stays away past its waiting (`StudioTask.database_retries`, about
ten minutes) still fails the video with the reason."""


def fail_on_error(task: Task, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: ExceptionInfo) -> None:  # noqa: ARG001
    """A step failed for good (its retries spent): skip the video with the reason, and the batch goes on; a
    lost connection is transient and fails nothing (`LOST_CONNECTION`)."""
    payload = StepPayload.of_message(args, kwargs)
    if payload is None:
        return  # a message that named no video: nothing to skip
    if isinstance(exc, LeaseHeld) or (isinstance(exc, LOST_CONNECTION) and not isinstance(exc, PeerUnavailable)):
        log.warning(
            "%s of video %s attempt %s ended on %s (%s); not the video's fault: reconcile sends it again",
            task.name,
            payload.video_id,
            payload.attempt,
            type(exc).__name__,
            exc,
        )
        return
    settings = task.app.settings
    step = getattr(task, "step", None)
    what = step.name if step is not None else task.name.rsplit(".", 1)[-1]
    reason = redact_text(f"{what} failed: {type(exc).__name__}: {exc}", settings.secret_values())[:400]
    ended = None
    with session_scope(settings) as session:
        session.execute(
            sa.update(Attempt)
            .where(Attempt.video_id == payload.video_id, Attempt.number == payload.attempt)
            .values(
                failure_reasons=sa.func.coalesce(Attempt.failure_reasons, sa.text("'[]'::jsonb")).op("||")(
                    sa.func.jsonb_build_array(reason)
                )
            )
        )
        at = (step.state, payload.attempt) if step is not None else None
        ended = ending.give_up(settings, session, payload.video_id, S.failed, reason, at=at)
    if ended is not None:
        ended.run(task.app)


def fail_batch(settings: Settings, batch_id: int, reason: str) -> bool:
    """A batch whose planning failed for good ends `failed` with the reason; False if it was not queued."""
    reason = redact_text(reason, settings.secret_values())[:1000]
    with session_scope(settings) as session:
        changed = rows_changed(
            session,
            (
                sa.update(Batch)
                .where(Batch.id == batch_id, Batch.status == BatchStatus.queued)
                .values(status=BatchStatus.failed, failure_reason=reason, updated_at=sa.func.now())
            ),
        )
        if changed:
            batch = session.get_one(Batch, batch_id)
            events.record(session, settings, type="batch.failed", batch=batch, data={"reason": reason})
        return changed == 1


def fail_planning(task: Task, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: ExceptionInfo) -> None:  # noqa: ARG001
    """`on_failure` of planning: its retries are spent, or the error cannot pass by retrying."""
    batch_id = args[0] if args else kwargs.get("batch_id")
    fail_batch(task.app.settings, batch_id, f"planning failed: {type(exc).__name__}: {exc}")
