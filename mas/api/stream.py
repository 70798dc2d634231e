"""Server-sent events: what happens in the studio, as it happens (`text/event-stream`).

    GET /api/v1/events                 the caller's events: a member's own batches', an admin's everyone's (or
                                       one user's, `?user=NAME`)
    GET /api/v1/batches/{id}/events    one batch's (another member's batch is not found, word for word as a
                                       missing one)

Each event of the studio's event log (`mas.outbox.eventlog`) is sent with `id:` (its place in the log),
`event:` (its type) and `data:` (JSON shaped as the webhooks' bodies, `{"type", "timestamp", "data"}`). A client
that reconnects with `Last-Event-ID` (a browser's EventSource sends it by itself) or `?after=ID` gets every event
after that one and none twice, since the log's ids commit in increasing order. With neither, the stream starts
after the newest event; its opening message carries that id, so a client that drops before any event still
resumes exactly. A render's progress (`video.progress`, `mas.outbox.progress`) is sent without an id: it is
never replayed and leaves the client's Last-Event-ID alone. A comment every MAS_STREAM_KEEPALIVE_SECONDS keeps a
quiet stream open; `retry:` asks a client to reconnect after RETRY_MS.

A stream is an async generator: every MAS_STREAM_POLL_SECONDS it reads the log after its last id and drains its
progress feed, each in a worker thread for a few milliseconds (sync SQLAlchemy and Redis), and sleeps in the
event loop between. A database that is away (a restart, a failover) is waited out for MAS_DATABASE_WAIT_SECONDS,
the stream saying `: database failing over` at each poll. It ends when the client goes (Starlette cancels it) or
the database stays away past that (the client then reconnects and resumes), and gives its slot back: one
process serves at most MAS_STREAM_MAX streams (each polls PostgreSQL and holds a Redis connection); one more is
refused with 503 and Retry-After.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any

import anyio.to_thread
import sqlalchemy as sa
from fastapi import APIRouter, Header, Query, Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from mas.accounts.visibility import visible
from mas.api import sse
from mas.api.callers import identity_of, settings_of
from mas.api.problems import MEDIA_TYPE, NotFound
from mas.config import Settings
from mas.db import is_row_id, session_scope
from mas.domain.identity import Identity
from mas.errors import PeerUnavailable
from mas.models import Batch
from mas.outbox import eventlog, progress
from mas.runtime import failover
from mas.runtime.failover import DATABASE_AWAY

log = logging.getLogger(__name__)
router = APIRouter(tags=["events"])

RETRY_MS = 3000
"""How long a client waits before it reconnects (the `retry:` hint)."""
EXAMPLE = (
    "retry: 3000\nid: 41\n\n"
    'id: 42\nevent: video.state\ndata: {"type":"video.state","timestamp":"2026-01-01T02:00:00+00:00",'
    '"data":{"batch_id":7,"video_id":19,"from":"writing","to":"rendering","attempt":1}}\n\n'
    'event: video.progress\ndata: {"type":"video.progress","timestamp":"2026-01-01T02:00:03+00:00",'
    '"data":{"batch_id":7,"video_id":19,"attempt":1,"step":"render","done":12,"total":40,"percent":30}}\n\n'
    ": keep-alive\n\n"
)
STREAM_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Server-sent events until the client goes: `id:` (resume with `Last-Event-ID`), `event:` "
        "(the type) and `data:` (JSON `{type, timestamp, data}`); progress comes without an id; comments keep "
        "the stream open.",
        "content": {"text/event-stream": {"schema": {"type": "string"}, "example": EXAMPLE}},
    },
    **{
        status: {"description": "A problem (RFC 9457).", "content": {MEDIA_TYPE: {"schema": {"type": "object"}}}}
        for status in (403, 404, 422, 503)
    },
}
AFTER = Query(ge=0, le=sse.MAX_ID, description="Start after this event id (a `Last-Event-ID` header wins).")
LAST_EVENT_ID = Header(
    alias="Last-Event-ID", description="The id of the last event the client got: the stream resumes after it."
)


class StreamsFull(PeerUnavailable):
    """This process serves as many event streams as MAS_STREAM_MAX allows: try again shortly (or another)."""


class Slots:
    """The streams one process may serve at once."""

    def __init__(self, limit: int) -> None:
        self.limit, self.taken = limit, 0
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            if self.taken >= self.limit:
                return False
            self.taken += 1
            return True

    def give_back(self) -> None:
        with self._lock:
            self.taken -= 1


class EventStream(StreamingResponse):
    """A `text/event-stream` response that runs `on_close` once it is over, however it ends."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[bytes], *, on_close: Callable[[], None]) -> None:
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


@dataclass(frozen=True)
class Selection:
    """Which events a stream carries: everyone's, one user's, or one batch's (whose owner's progress it
    follows)."""

    user: str | None = None
    batch_id: int | None = None
    owner: str | None = None


@router.get("/events", response_class=EventStream, status_code=200, responses=STREAM_RESPONSES)
async def follow_events(
    request: Request,
    user: Annotated[
        str | None, Query(description="An admin: only this user's events (a member gets their own only).")
    ] = None,
    after: Annotated[int | None, AFTER] = None,
    last_event_id: Annotated[str | None, LAST_EVENT_ID] = None,
) -> EventStream:
    """The caller's events as they happen (a member's own batches', an admin's everyone's or `user`'s), as
    server-sent events; resumable with `Last-Event-ID`."""
    who = identity_of(request).scope(user)  # the one visibility rule: None is everyone's
    return await _open(request, Selection(user=who, owner=who), sse.resume_point(last_event_id, after))


@router.get("/batches/{batch_id}/events", response_class=EventStream, status_code=200, responses=STREAM_RESPONSES)
async def follow_batch(
    batch_id: int,
    request: Request,
    after: Annotated[int | None, AFTER] = None,
    last_event_id: Annotated[str | None, LAST_EVENT_ID] = None,
) -> EventStream:
    """One batch's events as they happen, as server-sent events; resumable with `Last-Event-ID`."""
    resume = sse.resume_point(last_event_id, after)
    owner = await anyio.to_thread.run_sync(_owner, settings_of(request), identity_of(request), batch_id)
    if owner is None:
        raise NotFound(f"there is no batch {batch_id}")
    return await _open(request, Selection(batch_id=batch_id, owner=owner), resume)


def _owner(settings: Settings, identity: Identity, batch_id: int) -> str | None:
    """Whose the batch is, if `identity` may see it; None when it may not, or there is none."""
    if not is_row_id(batch_id):
        return None
    with session_scope(settings) as session:
        mine = sa.select(Batch.user_name).where(Batch.id == batch_id, visible(identity, Batch.user_name))
        return session.scalar(mine)


def _newest(settings: Settings) -> int:
    with session_scope(settings) as session:
        return eventlog.newest(session)


async def _open(request: Request, selection: Selection, resume: int | None) -> EventStream:
    settings: Settings = request.app.state.settings
    slots: Slots = request.app.state.streams
    if resume is None:
        resume = await anyio.to_thread.run_sync(_newest, settings)
    if not slots.take():
        raise StreamsFull(f"this server has {slots.limit} event streams open (MAS_STREAM_MAX); try again shortly")
    try:
        return EventStream(_events(settings, selection, resume), on_close=slots.give_back)
    except BaseException:
        slots.give_back()
        raise


async def _events(settings: Settings, selection: Selection, last: int) -> AsyncIterator[bytes]:
    """The stream's bytes: its opening, then events, progress and keep-alives until it is cancelled."""
    poll_s, keepalive_s = settings.service.stream_poll_seconds, settings.service.stream_keepalive_seconds
    wait_s = settings.reliability.database_wait_seconds
    feed = progress.Feed(settings, user=selection.owner, batch_id=selection.batch_id)
    read = partial(eventlog.read_after, settings, user=selection.user, batch_id=selection.batch_id)
    try:
        await anyio.to_thread.run_sync(feed.open)  # progress published from here on is seen
        yield sse.opening(retry_ms=RETRY_MS, last_id=last)
        quiet_since, away_since = time.monotonic(), None
        while True:
            try:
                logged = await anyio.to_thread.run_sync(read, last)
            except DATABASE_AWAY as exc:
                away_since = away_since or time.monotonic()
                if time.monotonic() - away_since >= wait_s:
                    log.warning("event stream ended (the client resumes after event %d): %s", last, exc)
                    yield sse.comment(f"the database did not answer for {wait_s:.0f} s: resume after event {last}")
                    return
                yield sse.comment(failover.FAILING_OVER)
                quiet_since = time.monotonic()
                await anyio.sleep(poll_s)
                continue
            if away_since is not None:
                yield sse.comment("database answers again")
                away_since = None
            chunk = [sse.event(e.type, e.body, id=e.id) for e in logged]
            last = logged[-1].id if logged else last
            behind = len(logged) == eventlog.PAGE  # more are waiting: no pause, progress after
            if not behind:
                chunk += [sse.event(progress.EVENT, body) for body in await anyio.to_thread.run_sync(feed.drain)]
            if chunk:
                yield b"".join(chunk)
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= keepalive_s:
                yield sse.comment("keep-alive")
                quiet_since = time.monotonic()
            if not behind:
                await anyio.sleep(poll_s)
    finally:
        feed.close()
