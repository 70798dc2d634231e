"""Webhook delivery against real parts: a real HTTP receiver (a threaded http.server here), real PostgreSQL and
Redis, and real Celery workers and beat where the pipeline runs. What a receiver must be able to count on:
every event signed (Standard Webhooks), at least once, a batch's events in order, one id per event however
often it is sent, and a receiver that stays down never holding the pipeline.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from pydantic import SecretStr, ValidationError
from standardwebhooks.webhooks import Webhook

from mas import db
from mas.cli import main
from mas.models import Batch, BatchStatus, Schedule, StepLease, Video, VideoState, WebhookEvent
from mas.outbox import webhooks
from tests.studio import IsolatedStudio

SECRET = "whsec_" + base64.b64encode(os.urandom(32)).decode()


@dataclass(frozen=True)
class Delivery:
    headers: dict[str, str]
    body: bytes
    status: int

    @property
    def id(self) -> str:
        return self.headers["webhook-id"]

    @property
    def event(self) -> dict:
        return json.loads(self.body)


class Receiver:
    """A real HTTP receiver on 127.0.0.1: answers 503 to its first `fail_first` deliveries, then 200, each after
    `delay` seconds; records every delivery (headers, body, answer) in the order they arrive."""

    def __init__(self, *, fail_first: int = 0, delay: float = 0.0) -> None:
        self.deliveries: list[Delivery] = []
        lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                time.sleep(delay)
                with lock:
                    status = 503 if len(receiver.deliveries) < fail_first else 200
                    headers = {name.lower(): value for name, value in self.headers.items()}
                    receiver.deliveries.append(Delivery(headers, body, status))
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks"

    def __enter__(self) -> Receiver:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def accepted(self) -> list[Delivery]:
        return [d for d in self.deliveries if d.status == 200]


def _refused_url() -> str:
    """The URL of a port nothing listens on: a receiver that is down."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/hooks"


def _wait(condition, *, timeout: float, what: str, every: float = 0.3) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(every)
    raise TimeoutError(f"timed out waiting for {what}")


def _events(settings, batch_id: int | None = None) -> list[WebhookEvent]:
    with db.session_scope(settings) as s:
        query = sa.select(WebhookEvent).order_by(WebhookEvent.seq)
        if batch_id is not None:
            query = query.where(WebhookEvent.batch_id == batch_id)
        return list(s.scalars(query))


def _add_events(settings, *, url: str, batches: int, each: int) -> list[str]:
    """Outbox rows as `mas.outbox.events` writes them (batch ids are plain numbers: no batch rows needed)."""
    ids = []
    with db.session_scope(settings) as s:
        for batch_id in range(1, batches + 1):
            for n in range(each):
                ids.append(event_id := f"msg_{os.urandom(16).hex()}")
                payload = {"type": "video.accepted", "timestamp": "t", "data": {"batch_id": batch_id, "n": n}}
                s.add(WebhookEvent(id=event_id, type="video.accepted", url=url, batch_id=batch_id, payload=payload))
    return ids


def _with_webhooks(settings, **update):
    return settings.model_copy(update={"webhook_secret": SecretStr(SECRET), **update})


# --- across a gpu worker killed mid-render ---------------------------------------------------------------


@pytest.fixture
def data_dir():
    with tempfile.TemporaryDirectory(prefix="mas-webhooks-") as tmp:
        Path(tmp).chmod(0o755)  # as root, the embedded PostgreSQL runs as another user that must enter it
        yield Path(tmp)


def _render_running(studio: IsolatedStudio, batch_id: int) -> StepLease | None:
    with db.session_scope(studio.settings) as s:
        return s.scalars(
            sa.select(StepLease)
            .join(Video, Video.id == StepLease.video_id)
            .where(Video.batch_id == batch_id, StepLease.step == "render", StepLease.token.is_not(None))
        ).first()


def _lease_lapsed(studio: IsolatedStudio, lease: StepLease) -> bool:
    """The killed render's lease missed its heartbeats for longer than the expiry (it counts as lost), or
    something took it over already."""
    with db.session_scope(studio.settings) as s:
        heartbeat = s.scalar(
            sa.select(StepLease.heartbeat_at).where(
                StepLease.video_id == lease.video_id,
                StepLease.attempt == lease.attempt,
                StepLease.step == "render",
                StepLease.token == lease.token,
            )
        )
        now = s.scalar(sa.select(sa.func.now()))
    return heartbeat is None or (now - heartbeat).total_seconds() > studio.settings.reliability.lease_expiry_seconds


def _all_delivered(studio: IsolatedStudio, batch_id: int) -> bool:
    events = _events(studio.settings, batch_id)
    return any(e.type == "batch.done" for e in events) and all(e.delivered_at is not None for e in events)


def test_a_receiver_that_fails_then_accepts_gets_each_event_once_in_order_across_a_gpu_worker_kill(data_dir):
    """Beat delivers while a batch of 4 runs; the receiver answers 503 three times first; the gpu worker is
    SIGKILLed mid-render, started again and `mas recover` run. After dropping repeats by webhook-id the
    receiver has each video's final event and one batch.done, in the order they were written, batch.done
    last, every delivery signed; the failed tries were sent again under the same id."""
    with (
        Receiver(fail_first=3) as receiver,
        IsolatedStudio(
            data_dir,
            MAS_PREVIEW_RENDER_SECONDS="2",
            MAS_LEASE_HEARTBEAT_SECONDS="0.5",
            MAS_LEASE_EXPIRY_SECONDS="2",
            MAS_WEBHOOK_EVERY_SECONDS="0.5",
            MAS_WEBHOOK_URL=receiver.url,
            MAS_WEBHOOK_SECRET=SECRET,
        ) as studio,
    ):
        studio.worker("cpu", concurrency=2)
        gpu = studio.worker("gpu")
        studio.beat()
        batch_id = studio.enqueue("Create 4 videos of harbour cranes")
        studio.wait_until(lambda: _render_running(studio, batch_id) is not None, what="a render holding its lease")
        lease = _render_running(studio, batch_id)
        gpu.kill()
        studio.worker("gpu")
        studio.wait_until(lambda: _lease_lapsed(studio, lease), timeout=60, what="the killed render's lease to lapse")
        result = studio.mas("recover")
        assert result.returncode == 0, result.stderr
        studio.wait_batch(batch_id, timeout=300)
        studio.wait_until(lambda: _all_delivered(studio, batch_id), timeout=180, what="every event delivered")
        events = _events(studio.settings, batch_id)
        videos = studio.videos(batch_id)
        with db.session_scope(studio.settings) as s:
            killed = s.get_one(StepLease, (lease.video_id, lease.attempt, "render"))
        assert killed.claims == 2  # the killed render was taken over and run again

    # the outbox: one final event per video, one batch.done, all to the studio's receiver
    assert len(videos) == 4 and all(v.state in (VideoState.accepted, VideoState.failed) for v in videos)
    finals = {e.payload["data"]["video_id"]: e.type for e in events if e.type.startswith("video.")}
    assert finals == {v.id: f"video.{v.state.value}" for v in videos}
    assert [e.type for e in events].count("batch.done") == 1 and len(events) == 5
    assert {e.url for e in events} == {receiver.url} and not [e for e in events if e.failed_at]

    # every delivery signed; its body the event; one id per event however often it was sent
    verifier = Webhook(SECRET)
    for delivery in receiver.deliveries:
        assert verifier.verify(delivery.body, delivery.headers) == delivery.event
        assert delivery.headers["content-type"] == "application/json"
    by_id = {e.id: e for e in events}
    for delivery in receiver.deliveries:
        assert delivery.event["type"] == by_id[delivery.id].type
        assert delivery.event["data"]["batch_id"] == batch_id
    first_arrivals = list(dict.fromkeys(d.id for d in receiver.deliveries))
    assert first_arrivals == [e.id for e in events]  # in the order written, batch.done last
    assert by_id[first_arrivals[-1]].type == "batch.done"
    accepted = Counter(d.id for d in receiver.accepted())
    assert set(accepted) == set(by_id) and set(accepted.values()) == {1}

    # the early 503s were tried again under the same id, later
    sent = Counter(d.id for d in receiver.deliveries)
    assert [d.status for d in receiver.deliveries[:3]] == [503, 503, 503]
    assert max(sent.values()) > 1 and sum(sent.values()) == len(events) + 3
    assert all(d.id in accepted for d in receiver.deliveries[:3])


# --- backoff, failure and order, calling the deliverer directly ------------------------------------------


@pytest.mark.usefixtures("workers")
def test_a_receiver_that_stays_down_backs_off_and_fails_while_its_batch_finishes(clean):
    """A batch whose own receiver (`notify_url`) refuses every connection: the batch finishes as any other
    while a deliverer keeps trying; each event waits longer after each failure (2 s, then 4 s, less jitter),
    the batch's later events wait for the earlier ones, and each is given up after MAS_WEBHOOK_MAX_ATTEMPTS."""
    from mas.domain.requests import parse_request
    from mas.pipeline import production

    settings = _with_webhooks(clean, webhook_max_attempts=3)
    down = _refused_url()
    batch_id = production.submit(settings, parse_request("Create 2 videos of rope bridges", settings), notify_url=down)

    def done() -> bool:
        webhooks.deliver_due(settings)  # a deliverer runs all along; it never raises for the receiver
        with db.session_scope(settings) as s:
            return s.get_one(Batch, batch_id).status == BatchStatus.done

    _wait(done, timeout=180, what=f"batch {batch_id} to finish")
    events = _events(settings, batch_id)
    assert [e.type for e in events][-1] == "batch.done" and len(events) == 3
    assert {e.url for e in events} == {down} and not [e for e in events if e.delivered_at]

    backed_off = set()  # the tries after which a wait was checked
    for _ in range(3 * settings.webhooks.max_attempts):
        with db.session_scope(settings) as s:  # the backoff is what is checked here: skip waiting it out
            s.execute(
                sa.update(WebhookEvent).where(WebhookEvent.batch_id == batch_id).values(next_attempt_at=sa.func.now())
            )
        with db.session_scope(settings) as s:
            before = s.scalar(sa.select(sa.func.now()))
        started = time.monotonic()
        report = webhooks.deliver_due(settings)
        took = time.monotonic() - started
        if not report.tried:
            break
        assert report.tried == 1 and not report.delivered  # only the batch's earliest unfinished event is due
        (event,) = [e for e in _events(settings, batch_id) if e.id in report.retrying + report.failed]
        later = [e for e in _events(settings, batch_id) if e.seq > event.seq]
        assert all(e.attempts == 0 for e in later)  # they wait for this one to be delivered or given up
        if event.failed_at is None:  # 2 s after the first failure, 4 s after the second, less jitter
            wait = (event.next_attempt_at - before).total_seconds()
            full = 2.0 * 2 ** (event.attempts - 1)
            assert 0.8 * full <= wait <= full + took + 0.5, (event.attempts, wait, took)
            backed_off.add(event.attempts)
    assert backed_off == {1, 2}
    for event in _events(settings, batch_id):
        assert event.attempts == 3 and event.failed_at is not None and event.delivered_at is None
        assert "ConnectError" in event.last_error
    assert webhooks.pending(settings) == []
    assert {e.id for e in webhooks.failed(settings)} == {e.id for e in events}




def test_two_deliverers_at_once_send_each_event_once_and_each_batch_in_order(clean):
    """Two deliverers racing over 24 events of 6 batches against a receiver that takes its time: no event is
    sent twice (claims skip each other's rows), each batch arrives in the order written."""
    settings = _with_webhooks(clean)
    with Receiver(delay=0.05) as receiver:
        ids = _add_events(settings, url=receiver.url, batches=6, each=4)
        errors = []

        def deliver() -> None:
            try:
                while webhooks.deliver_due(settings, limit=3).tried:
                    pass
            except Exception as exc:  # pragma: no cover - shown by the assertion below
                errors.append(exc)

        threads = [threading.Thread(target=deliver) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    assert not errors
    assert Counter(d.id for d in receiver.deliveries) == Counter(ids)
    for batch_id in range(1, 7):
        arrived = [d.event["data"]["n"] for d in receiver.deliveries if d.event["data"]["batch_id"] == batch_id]
        assert arrived == [0, 1, 2, 3]
    assert all(e.delivered_at is not None and e.attempts == 1 for e in _events(settings))


def test_events_claimed_by_a_deliverer_that_died_before_sending_are_sent_once_its_claim_lapses(clean):
    """A deliverer killed between its claim and the receiver's answer: its events are not sent by another at
    once (the claim holds them for the timeout plus a margin), then they are, under the same ids."""
    settings = _with_webhooks(clean, webhook_timeout_seconds=0.5)
    with Receiver() as receiver:
        ids = _add_events(settings, url=receiver.url, batches=2, each=1)
        assert [c.id for c in webhooks._claim(settings, limit=50)] == ids  # ... and the deliverer dies here
        assert not webhooks.deliver_due(settings).tried
        _wait(lambda: webhooks.deliver_due(settings).tried, timeout=60, what="the lapsed claims to be sent")
    assert sorted(d.id for d in receiver.deliveries) == sorted(ids)
    assert all(e.delivered_at is not None and e.attempts == 1 for e in _events(settings))


def test_a_missing_or_unusable_secret_is_one_line_and_tries_nothing(clean):
    _add_events(clean, url=_refused_url(), batches=1, each=1)
    with pytest.raises(webhooks.SigningSecretUnusable, match="MAS_WEBHOOK_SECRET"):
        webhooks.deliver_due(clean.model_copy(update={"webhook_secret": None}))
    with pytest.raises(ValidationError, match="MAS_WEBHOOK_SECRET"):  # an unusable one is refused on reading
        clean.model_copy(update={"webhook_secret": SecretStr("whsec_not*base64")})
    (event,) = _events(clean)
    assert event.attempts == 0 and event.last_error is None


# --- the command line ------------------------------------------------------------------------------------


def _cli(*args: str, secret: str | None = SECRET):
    return CliRunner().invoke(main, list(args), env={"MAS_WEBHOOK_SECRET": secret, "COLUMNS": "200"})


def test_mas_webhooks_lists_pending_and_failed_events_with_urls_redacted(clean):
    settings = _with_webhooks(clean)
    assert "no webhook events pending or failed" in _cli("webhooks").output
    url = "http://hooks:s3cretpw@127.0.0.1:9/in?token=t0psecret"
    pending_id, failed_id, delivered_id = _add_events(settings, url=url, batches=3, each=1)
    with db.session_scope(settings) as s:
        s.execute(
            sa.update(WebhookEvent)
            .where(WebhookEvent.id == pending_id)
            .values(attempts=2, last_error="HTTP 503", next_attempt_at=sa.func.now() + sa.text("interval '1 hour'"))
        )
        s.execute(
            sa.update(WebhookEvent)
            .where(WebhookEvent.id == failed_id)
            .values(attempts=15, failed_at=sa.func.now(), last_error="ConnectError: refused")
        )
        s.execute(sa.update(WebhookEvent).where(WebhookEvent.id == delivered_id).values(delivered_at=sa.func.now()))
    result = _cli("webhooks")
    assert result.exit_code == 0, result.output
    out = result.output
    pending_part, failed_part = out.split("failed: 1")
    assert "pending: 1" in pending_part and pending_id in pending_part and "2 tries" in pending_part
    assert "HTTP 503" in pending_part and "batch 1" in pending_part and "video.accepted" in pending_part
    assert failed_id in failed_part and "15 tries" in failed_part and "ConnectError: refused" in failed_part
    assert delivered_id not in out
    assert "s3cretpw" not in out and "t0psecret" not in out and "http://hooks:***@127.0.0.1:9/in?token=***" in out


def _count(settings, model) -> int:
    with db.session_scope(settings) as s:
        return s.scalar(sa.select(sa.func.count()).select_from(model))


def test_notify_stores_the_batch_receiver_and_a_bad_url_or_missing_secret_stores_nothing(clean):
    url = "http://127.0.0.1:9/hooks"
    for args in (
        ("enqueue", "--notify", url, "Create 2 videos of kites"),
        ("series", "Kite Days", "--episodes", "1", "--notify", url),
        ("ab", "a kite over dunes", "--notify", url),
    ):
        result = _cli(*args)
        assert result.exit_code == 0, result.output
        batch_id = int(result.output.split()[1].rstrip(":"))
        with db.session_scope(clean) as s:
            assert s.get_one(Batch, batch_id).notify_url == url
    result = _cli("enqueue", "--at", "03:00", "--notify", url, "Create 2 videos of kites")
    assert result.exit_code == 0, result.output
    with db.session_scope(clean) as s:
        assert s.scalars(sa.select(Schedule.notify_url)).one() == url

    batches, schedules = _count(clean, Batch), _count(clean, Schedule)
    for args, secret, says in (
        (("enqueue", "--notify", "ftp://127.0.0.1/hooks", "Create 2 videos of kites"), SECRET, "not an http(s) URL"),
        (("enqueue", "--notify", "not a url", "Create 2 videos of kites"), SECRET, "not an http(s) URL"),
        (("enqueue", "--notify", url, "Create 2 videos of kites"), None, "needs MAS_WEBHOOK_SECRET"),
        (("ab", "a kite", "--notify", url), None, "needs MAS_WEBHOOK_SECRET"),
        (("enqueue", "--at", "03:00", "--notify", "file:///etc/passwd", "Create 2 videos of kites"), SECRET, "not an http(s)"),
    ):
        result = _cli(*args, secret=secret)
        assert result.exit_code == 2, result.output
        assert says in result.output and "Traceback" not in result.output
    assert (_count(clean, Batch), _count(clean, Schedule)) == (batches, schedules)


