"""Events for other programs, written to the webhook outbox and the event log in the transaction of the change
they report.

An event is one row of the studio's event log (`mas.outbox.eventlog`, what the API's event streams follow), and a
row per receiver (the studio-wide MAS_WEBHOOK_URL, and the URL the request named with
`--notify` or the API's `notify_url`), so the change and the promise to report it commit together or not at
all; `mas.outbox.webhooks` delivers them at least once, in order per batch and receiver. The payload follows the
Standard Webhooks shape: `{"type", "timestamp", "data"}`.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any, Literal

from sqlalchemy.orm import Session

from mas.config import Settings
from mas.models import Batch, WebhookEvent
from mas.outbox import eventlog

EventType = Literal[
    "batch.done", "batch.failed", "batch.cancelled", "video.accepted", "video.failed", "video.cancelled", "ab.ready"
]
"""What happened: a batch finished (all its videos final), failed (planning gave up) or was cancelled; a video
was accepted, failed for good or was cancelled; an A/B test's variations are all finished and wait for a pick."""


def receivers(settings: Settings, batch: Batch) -> list[str]:
    """Where a batch's events go: the studio's receiver and the request's own, each once."""
    return [url for url in dict.fromkeys([settings.webhooks.url, batch.notify_url]) if url]


def record(session: Session, settings: Settings, *, type: EventType, batch: Batch, data: dict[str, Any]) -> None:
    """Add the event to the event log and for each receiver of `batch` to the session (committed with the
    caller's change)."""
    eventlog.record(session, type, batch_id=batch.id, user_name=batch.user_name, data={"batch_id": batch.id, **data})
    timestamp = datetime.now(UTC).isoformat()
    for url in receivers(settings, batch):
        session.add(
            WebhookEvent(
                id=f"msg_{uuid.uuid4().hex}",
                type=type,
                url=url,
                batch_id=batch.id,
                payload={"type": type, "timestamp": timestamp, "data": {"batch_id": batch.id, **data}},
            )
        )
