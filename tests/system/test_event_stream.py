"""The studio's event log and its server-sent event streams, on real PostgreSQL and Redis (and real workers for a
whole batch): a client that keeps dropping and resuming with Last-Event-ID sees every event of a batch once and
in order, exactly as the log holds them; a member's stream carries only their own work and another's batch
stream is not found, word for word as a missing one; an event whose transaction took the smaller id but commits
later is never skipped; render progress streams without an id and is never replayed; keep-alives, the cap on
streams, and retention."""

from __future__ import annotations

import json
import random
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from itertools import pairwise
from types import SimpleNamespace

import pytest
import sqlalchemy as sa
from sqlalchemy import event as orm_event
from starlette.testclient import TestClient

from mas import locks, names
from mas.accounts import users
from mas.db import session_scope
from mas.domain.identity import Actor
from mas.domain.requests import ProductionRequest
from mas.domain.states import BatchStatus, VideoState
from mas.gallery import create_app
from mas.models import Batch, StudioEvent, Video, WebhookEvent
from mas.outbox import eventlog
from mas.pipeline import ending, production
from tests.harness.gallery import served_gallery
from tests.harness.processes import wait_for

S = VideoState
DEADLINE_S = 600  # a few preview renders on a loaded 2-core machine; the wait ends when the batch does
MISSING = 987654


@dataclass
class Message:
    """One message of an event stream, as the HTML standard parses it."""

    id: str | None = None
    event: str | None = None
    data: list[str] = field(default_factory=list)
    retry: int | None = None
    comment: str | None = None

    @property
    def body(self) -> dict:
        return json.loads("\n".join(self.data))


def messages(reply) -> Iterator[Message]:
    """The messages of a streamed response, each as its blank line arrives (a comment is a message of its own)."""
    current = Message()
    for line in reply.iter_lines():
        if line == "":
            if current != Message():
                yield current
            current = Message()
        elif line.startswith(":"):
            yield Message(comment=line[1:].strip())
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data":
                current.data.append(value)
            elif name == "retry":
                current.retry = int(value)
            elif name in ("id", "event"):
                setattr(current, name, value)


def until_quiet(stream: Iterator[Message]) -> list[Message]:
    """The messages before the first keep-alive: everything the stream had to send (it is caught up)."""
    got = []
    for message in stream:
        if message.comment == "keep-alive":
            return got
        got.append(message)
    raise AssertionError("the stream ended")


def quick(settings, **changes):
    return settings.changed(stream_poll_seconds=0.05, stream_keepalive_seconds=0.5, **changes)


def new_batch(settings, user: str, theme: str = "kites") -> int:
    with session_scope(settings) as session:
        request = ProductionRequest.batch(theme, count=1, settings=settings)
        return production.new_batch(session, request, priority="normal", user=user).id


def _waiting_for_the_event_logs_lock(settings) -> bool:
    """Whether a transaction is queued for the event log's advisory lock (pg_locks splits its 64-bit key)."""
    key = locks.lock_key(names.EVENT_LOG_LOCK)
    with session_scope(settings) as session:
        return bool(
            session.scalar(
                sa.text(
                    "select count(*) from pg_locks where locktype = 'advisory' and not granted and objsubid = 1"
                    " and classid::bigint = :high and objid::bigint = :low"
                ),
                {"high": (key >> 32) & 0xFFFFFFFF, "low": key & 0xFFFFFFFF},
            )
        )


def logged(settings, after: int = 0) -> list[tuple[int, str, int | None]]:
    with session_scope(settings) as session:
        return list(
            session.execute(
                sa.select(StudioEvent.id, StudioEvent.type, StudioEvent.batch_id)
                .where(StudioEvent.id > after)
                .order_by(StudioEvent.id)
            ).all()
        )


@pytest.fixture
def members(clean):
    """Two members and an admin, with their API keys' headers; removed afterwards."""
    keys = {name: users.add(clean, name, role=role) for name, role in
            (("alice", "member"), ("bob", "member"), ("root", "admin"))}  # fmt: skip
    yield {name: {"Authorization": f"Bearer {key}"} for name, key in keys.items()}
    with session_scope(clean) as session:
        session.execute(sa.text("delete from users"))


# --- the log ---------------------------------------------------------------------------------------------------


def test_a_video_end_is_logged_with_its_move_in_one_transaction_and_a_rollback_logs_nothing(clean):
    settings = clean  # no webhook receiver: the log is written all the same, one row per event
    with session_scope(settings) as session:
        batch = Batch(request="r", theme="t", total=1, status=BatchStatus.running)
        session.add(batch)
        session.flush()
        video = Video(batch_id=batch.id, position=1, concept="c", attempt_count=1, state=S.reviewing)
        session.add(video)
        session.flush()
        batch_id, video_id = batch.id, video.id
    with pytest.raises(RuntimeError), session_scope(settings) as session:
        assert ending.end(settings, session, video_id, S.reviewing, S.accepted, attempt=1) is not None
        raise RuntimeError("rolled back")
    assert logged(settings) == []
    with session_scope(settings) as session:
        ending.end(settings, session, video_id, S.reviewing, S.accepted, attempt=1)
        savepoint = session.begin_nested()  # a savepoint's events go with it
        eventlog.record(session, "test.dropped", batch_id=batch_id, data={})
        savepoint.rollback()
    assert [(kind, b) for _, kind, b in logged(settings)] == [
        ("video.state", batch_id),
        ("video.accepted", batch_id),
        ("batch.done", batch_id),
    ]
    with session_scope(settings) as session:
        moved = session.scalars(sa.select(StudioEvent).where(StudioEvent.type == "video.state")).one()
        assert moved.user_name == "default"
        assert moved.payload == {"batch_id": batch_id, "video_id": video_id, "from": "reviewing", "to": "accepted",
                                 "attempt": 1}  # fmt: skip
        assert session.scalar(sa.select(sa.func.count()).select_from(WebhookEvent)) == 0


def test_an_event_that_took_the_smaller_id_and_commits_later_is_never_skipped(clean):
    """A takes its id and holds its commit; B records an event meanwhile. B cannot take a larger id and commit
    before A (it waits for the log's lock until A has committed), so a reader following the stream all along
    gets A's event, then B's, and never B's alone."""
    settings = quick(clean)
    batch_id = new_batch(settings, "default")
    start = logged(settings)[-1][0]
    http = TestClient(create_app(settings))
    got: list[Message] = []
    reading = threading.Event()

    def read() -> None:
        with http.stream("GET", f"/api/v1/events?after={start}") as reply:
            for message in messages(reply):
                reading.set()
                if message.event is not None:
                    got.append(message)
                    if len(got) == 2:
                        return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert reading.wait(30)
    a_inserted, a_may_commit, b_done = threading.Event(), threading.Event(), threading.Event()

    def transaction_a() -> None:
        with session_scope(settings) as session:
            eventlog.record(session, "test.a", batch_id=batch_id, data={"who": "a"})
            # runs after the log's own before_commit: A's row is inserted, its id taken, its commit not yet made
            orm_event.listen(session, "before_commit", lambda _: (a_inserted.set(), a_may_commit.wait(60)))

    def transaction_b() -> None:
        with session_scope(settings) as session:
            eventlog.record(session, "test.b", batch_id=batch_id, data={"who": "b"})
        b_done.set()

    a = threading.Thread(target=transaction_a, daemon=True)
    a.start()
    assert a_inserted.wait(30)
    b = threading.Thread(target=transaction_b, daemon=True)
    b.start()
    # B is seen queued behind A's lock, rather than given a guessed second to commit early
    wait_for(lambda: _waiting_for_the_event_logs_lock(settings), timeout=30, what="B to wait for the event log's lock")
    assert not b_done.is_set(), "B committed while A, holding the smaller id, had not"
    assert got == [] and logged(settings, start) == []  # nothing is visible, so nothing is served
    a_may_commit.set()
    a.join(30)
    assert b_done.wait(30)
    reader.join(30)
    ids = [(event_id, kind) for event_id, kind, _ in logged(settings, start)]
    assert [kind for _, kind in ids] == ["test.a", "test.b"] and ids[0][0] < ids[1][0]
    assert [(int(m.id or 0), m.event) for m in got] == ids


# --- streams ---------------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("workers")
def test_a_client_that_drops_and_resumes_sees_every_event_of_a_batch_once_and_in_order(clean):
    settings = quick(clean)
    http = TestClient(create_app(settings))
    with http.stream("GET", "/api/v1/events") as reply:  # no id given: from the newest event on
        opening = next(messages(reply))
    assert opening.retry == 3000 and opening.id == "0" and opening.event is None
    made = http.post("/api/v1/batches", json={"theme": "paper boats", "count": 2})
    assert made.status_code == 201, made.text
    batch_id = made.json()["batch_id"]

    seen: list[Message] = []
    progress: list[Message] = []
    last, connections, rng = opening.id, 0, random.Random(11)
    deadline = time.monotonic() + DEADLINE_S
    while not any(m.event == "batch.done" for m in seen):
        assert time.monotonic() < deadline, [m.event for m in seen]
        with http.stream("GET", "/api/v1/events", headers={"Last-Event-ID": str(last)}) as reply:
            connections += 1
            stream = messages(reply)
            assert next(stream).id == last  # the opening names where it resumes
            wanted = rng.randint(1, 4)  # read a few, then drop the connection mid-stream
            for message in stream:
                if message.event == "video.progress":
                    progress.append(message)
                elif message.event is not None:
                    seen.append(message)
                    last = message.id
                    wanted -= 1
                if not wanted or message.event == "batch.done":
                    break
    with http.stream("GET", "/api/v1/events", headers={"Last-Event-ID": str(last)}) as reply:
        rest = until_quiet(messages(reply))[1:]
    seen += [m for m in rest if m.id is not None]

    log = logged(settings)
    assert [(int(m.id or 0), m.event) for m in seen] == [(event_id, kind) for event_id, kind, _ in log]
    assert connections > 3 and all(b == batch_id for _, _, b in log)
    bodies = [m.body for m in seen]
    assert all(b["type"] == m.event and b["data"]["batch_id"] == batch_id for b, m in zip(bodies, seen))
    kinds = [b["type"] for b in bodies]
    assert kinds[:2] == ["batch.created", "batch.planned"] and kinds[-1] == "batch.done"
    for video_id in bodies[1]["data"]["videos"]:  # each video's moves, one after another, to its end
        moves = [b["data"] for b in bodies if b["type"] == "video.state" and b["data"]["video_id"] == video_id]
        path = [moves[0]["from"]] + [move["to"] for move in moves]
        assert all(a["to"] == b["from"] for a, b in pairwise(moves))
        assert path[:5] == ["waiting", "writing", "rendering", "grading", "reviewing"], path
        assert path[-1] in ("accepted", "failed")
        assert f"video.{path[-1]}" in kinds
    assert all(m.id is None and m.body["data"]["batch_id"] == batch_id for m in progress)
    print(f"{len(seen)} events over {connections} connections, {len(progress)} progress updates")


def test_a_members_stream_carries_only_their_own_work(clean, members):
    settings = quick(clean)
    http = TestClient(create_app(settings))
    mine, theirs = new_batch(settings, "alice"), new_batch(settings, "bob")
    from mas.pipeline import control

    control.pause_batch(settings, mine)
    control.pause_batch(settings, theirs)

    def events(path: str, who: str) -> list[tuple[str, int]]:
        with http.stream("GET", path, headers=members[who]) as reply:
            assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
            return [(m.event, m.body["data"]["batch_id"]) for m in until_quiet(messages(reply)) if m.event]

    both = [("batch.created", mine), ("batch.created", theirs), ("batch.paused", mine), ("batch.paused", theirs)]
    assert events("/api/v1/events?after=0", "alice") == [e for e in both if e[1] == mine]
    assert events("/api/v1/events?after=0", "bob") == [e for e in both if e[1] == theirs]
    assert events("/api/v1/events?after=0", "root") == both
    assert events("/api/v1/events?after=0&user=bob", "root") == [e for e in both if e[1] == theirs]
    assert events(f"/api/v1/batches/{mine}/events?after=0", "alice") == [e for e in both if e[1] == mine]
    assert events(f"/api/v1/batches/{theirs}/events?after=0", "root") == [e for e in both if e[1] == theirs]

    named = http.get("/api/v1/events?user=bob", headers=members["alice"])
    assert named.status_code == 403 and named.json()["type"] == "urn:mas:problem:forbidden"
    other = http.get(f"/api/v1/batches/{theirs}/events?after=0", headers=members["alice"])
    missing = http.get(f"/api/v1/batches/{MISSING}/events?after=0", headers=members["alice"])
    assert other.status_code == missing.status_code == 404
    assert other.text == missing.text.replace(str(MISSING), str(theirs))
    assert http.get("/api/v1/events").status_code == 401  # with users, no credential is no one
    bad = http.get("/api/v1/events", headers={**members["alice"], "Last-Event-ID": "forty-two"})
    assert bad.status_code == 422 and "Last-Event-ID" in bad.json()["detail"]


def test_render_progress_streams_without_an_id_to_its_owner_and_is_never_replayed(clean, members):
    from gpu.progress import ProgressPublisher

    settings = quick(clean)
    http = TestClient(create_app(settings))
    mine, also_mine, theirs = new_batch(settings, "alice"), new_batch(settings, "alice"), new_batch(settings, "bob")

    def render(batch_id: int, video_id: int, user: str, done: int) -> None:
        """What a render's progress thread does (gpu.progress), for a render of `user`'s batch."""
        task = SimpleNamespace(request=SimpleNamespace(id=f"task-{video_id}"), update_state=lambda **_: None)
        run = SimpleNamespace(
            task=task, video_id=video_id, attempt=1, settings=settings, actor=Actor(user), step=SimpleNamespace(name="render"),
            payload=SimpleNamespace(to_json=lambda: {"video_id": video_id, "attempt": 1}), describe=lambda: "a render",
        )  # fmt: skip
        publisher = ProgressPublisher(run, batch_id=batch_id)  # type: ignore[arg-type]
        publisher.publish(done, 40)
        time.sleep(0.3)  # its thread sends the latest value
        publisher.close()

    with http.stream("GET", "/api/v1/events", headers=members["alice"]) as reply:
        stream = messages(reply)
        opening = next(stream)  # the stream is subscribed from its opening on
        render(theirs, 3, "bob", 10)
        render(mine, 1, "alice", 12)
        got = next(m for m in stream if m.event)
        assert got.event == "video.progress" and got.id is None
        assert got.body["data"] == {"batch_id": mine, "video_id": 1, "attempt": 1, "step": "render", "done": 12,
                                    "total": 40, "percent": 30}  # fmt: skip
    with http.stream("GET", "/api/v1/events", headers={**members["alice"], "Last-Event-ID": opening.id}) as reply:
        assert [m for m in until_quiet(messages(reply))[1:] if m.event] == []  # progress is never replayed
    with http.stream("GET", f"/api/v1/batches/{also_mine}/events", headers=members["alice"]) as reply:
        stream = messages(reply)
        next(stream)
        render(mine, 1, "alice", 20)
        render(also_mine, 2, "alice", 40)
        got = next(m for m in stream if m.event)
        assert (got.body["data"]["video_id"], got.body["data"]["percent"]) == (2, 100)


def test_a_quiet_stream_sends_keep_alives_and_a_retry_hint(clean):
    http = TestClient(create_app(clean.changed(stream_keepalive_seconds=0.3)))
    with http.stream("GET", "/api/v1/events") as reply:
        assert reply.headers["cache-control"] == "no-cache"
        stream = messages(reply)
        started = time.monotonic()
        assert next(stream).retry == 3000
        assert [next(stream).comment, next(stream).comment] == ["keep-alive", "keep-alive"]
        assert time.monotonic() - started < 5


def test_streams_beyond_the_cap_are_refused_until_one_ends(clean):
    http = TestClient(create_app(quick(clean, stream_max=1)))
    with http.stream("GET", "/api/v1/events") as reply:
        stream = messages(reply)  # kept: a reader dropped closes its response
        next(stream)
        refused = http.get("/api/v1/events")
        assert refused.status_code == 503 and refused.headers["retry-after"] == "5"
        assert refused.json()["retryable"] is True and "MAS_STREAM_MAX" in refused.json()["detail"]
    with http.stream("GET", "/api/v1/events") as reply:  # the first one's slot came back when it ended
        assert reply.status_code == 200


def test_the_event_stream_is_in_the_openapi_document(clean):
    from openapi_spec_validator import validate

    document = TestClient(create_app(clean)).get("/api/v1/openapi.json").json()
    validate(document)
    for path in ("/events", "/batches/{batch_id}/events"):
        operation = document["paths"][path]["get"]
        assert "text/event-stream" in operation["responses"]["200"]["content"]
        assert "Last-Event-ID" in {p["name"] for p in operation["parameters"]}
        assert {"403", "404", "503"} <= set(operation["responses"])


def test_the_retention_job_deletes_only_old_events(clean):
    import beat_schedule
    from mas.runtime.app import Studio

    settings = clean.changed(event_retention_days=7)
    batch_id = new_batch(settings, "default")
    with session_scope(settings) as session:
        for age_days in (8, 30):
            eventlog.record(session, f"test.old.{age_days}", batch_id=batch_id, data={"age": age_days})
    with session_scope(settings) as session:
        for age_days in (8, 30):
            session.execute(
                sa.update(StudioEvent)
                .where(StudioEvent.type == f"test.old.{age_days}")
                .values(created_at=sa.func.now() - timedelta(days=age_days))
            )
    app = Studio(settings, set_as_current=False)
    app.loader.import_default_modules()
    assert app.tasks[names.EXPIRE_EVENTS].apply().get(timeout=60) == 2
    assert [kind for _, kind, _ in logged(settings)] == ["batch.created"]
    assert names.EXPIRE_EVENTS in {job["task"] for job in beat_schedule.schedule(settings).values()}


def test_the_gallery_pages_name_the_stream_they_follow(clean):
    """The gallery's pages carry the stream they follow, from the event they were rendered at."""
    batch_id = new_batch(clean, "default")
    http = TestClient(create_app(clean))
    newest = logged(clean)[-1][0]
    assert f'data-stream="/api/v1/events?after={newest}"' in http.get("/").text
    page = http.get(f"/batches/{batch_id}").text
    assert re.search(rf'data-stream="/api/v1/batches/{batch_id}/events\?after={newest}"', page)


def test_a_real_server_ends_a_stream_its_client_left_and_stops_with_streams_open(clean):
    """Under uvicorn (what `mas serve` runs): a client that goes gives its stream's slot back at once, and a
    server stopping ends the streams still open after its grace instead of waiting for them for ever."""
    import httpx

    with served_gallery(quick(clean)) as served, httpx.Client(timeout=10) as client:
        srv, thread, url = served.server, served.thread, f"{served.url}/api/v1/events"
        api = next(route.app for route in srv.config.app.routes if getattr(route, "path", "") == "/api/v1")
        with client.stream("GET", url) as reply:
            assert next(messages(reply)).retry == 3000
            assert api.state.streams.taken == 1
        deadline = time.monotonic() + 5
        while api.state.streams.taken:
            assert time.monotonic() < deadline, "the stream went on after its client left"
            time.sleep(0.05)
        with client.stream("GET", url) as reply:
            stream = messages(reply)
            next(stream)
            stopped = time.monotonic()
            srv.should_exit = True
            with pytest.raises(httpx.HTTPError):  # the server ends the stream: the client would reconnect
                for _ in stream:
                    pass
            thread.join(20)
    assert not thread.is_alive() and time.monotonic() - stopped < 15
