"""A render's progress for people watching live: published on Redis pub/sub, never stored.

The gpu worker's progress thread (`gpu.progress`, off the render's path) publishes each update on the channel of
the batch's user (`names.progress_channel`); an open event stream (`mas.api.stream`) subscribed to it passes the
newest value per video on as a `video.progress` event without an id. Nobody subscribed: the update is dropped.
Progress is a picture of now, so a stream that resumes never replays it, and the event log never holds it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from datetime import UTC, datetime
from typing import Any

import redis
from redis.client import PubSub

from mas import names
from mas.config import Settings
from mas.runtime.clients import redis_client

log = logging.getLogger(__name__)

EVENT = "video.progress"
RESUBSCRIBE_S = 5.0
"""How long a feed whose Redis went away waits before it subscribes again (streams go on without progress)."""


def publish(
    settings: Settings, *, user: str, batch_id: int, video_id: int, attempt: int, step: str, done: int, total: int
) -> None:
    """Tell whoever watches `user`'s work how far a step of a video has come (`done` of `total`)."""
    data = {
        "batch_id": batch_id,
        "video_id": video_id,
        "attempt": attempt,
        "step": step,
        "done": done,
        "total": total,
        "percent": round(100 * done / total) if total > 0 else 0,
    }
    body = {"type": EVENT, "timestamp": datetime.now(UTC).isoformat(), "data": data}
    redis_client(settings).publish(names.progress_channel(user), json.dumps(body))


class Feed:
    """The progress one stream follows: `user`'s (everyone's when None), or one batch's of it. Not thread-safe:
    one stream calls it from one thread at a time."""

    def __init__(self, settings: Settings, *, user: str | None, batch_id: int | None = None) -> None:
        self.settings, self.user, self.batch_id = settings, user, batch_id
        self._pubsub: PubSub | None = None
        self._retry_at = 0.0

    def open(self) -> None:
        """Subscribe (updates published before this are not seen); a Redis that does not answer is tried again
        later, and the stream goes on without progress meanwhile."""
        if self._pubsub is not None or time.monotonic() < self._retry_at:
            return
        pubsub = redis_client(self.settings).pubsub(ignore_subscribe_messages=True)
        try:
            if self.user is None:
                pubsub.psubscribe(names.PROGRESS_CHANNEL_PREFIX + "*")
            else:
                pubsub.subscribe(names.progress_channel(self.user))
        except (redis.RedisError, OSError) as exc:
            self._gone(pubsub, exc)
            return
        self._pubsub = pubsub

    def drain(self) -> list[dict[str, Any]]:
        """The newest update of each video published since the last drain (oldest video first), without
        waiting."""
        self.open()
        if self._pubsub is None:
            return []
        latest: dict[int, dict[str, Any]] = {}
        try:
            while (message := self._pubsub.get_message(timeout=0.0)) is not None:
                if message.get("type") not in ("message", "pmessage"):
                    continue
                body = json.loads(message["data"])
                data = body.get("data") or {}
                if self.batch_id is None or data.get("batch_id") == self.batch_id:
                    latest[int(data.get("video_id", 0))] = body
        except (redis.RedisError, OSError, ValueError) as exc:
            self._gone(self._pubsub, exc)
            self._pubsub = None
        return [latest[video_id] for video_id in sorted(latest)]

    def close(self) -> None:
        if self._pubsub is not None:
            pubsub, self._pubsub = self._pubsub, None
            _close(pubsub)

    def _gone(self, pubsub: PubSub, exc: BaseException) -> None:
        log.warning("render progress not followed for now: %s", exc)
        self._retry_at = time.monotonic() + RESUBSCRIBE_S
        _close(pubsub)


def _close(pubsub: PubSub) -> None:
    with contextlib.suppress(redis.RedisError, OSError):
        pubsub.close()
