"""Webhook delivery against real parts: a real HTTP receiver (a threaded http.server here), real PostgreSQL and
Redis, and real Celery workers and beat where the pipeline runs. What a receiver must be able to count on:
every event signed (Standard Webhooks), at least once, a batch's events in order, one id per event however
often it is sent, and a receiver that stays down never holding the pipeline. The receivers here listen on
127.0.0.1, which webhooks may reach only when MAS_WEBHOOK_ALLOWED_HOSTS allows it: the tests allow it, except
those that show the refusal.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from pydantic import SecretStr, ValidationError
from standardwebhooks.webhooks import Webhook

from mas import db
from mas.cli import main
from mas.domain.identity import STUDIO, Actor
from mas.errors import InvalidInput
from mas.models import Batch, BatchStatus, Schedule, StepLease, VideoState, WebhookEvent
from mas.outbox import events, webhooks
from tests.dns_faults import Dns
from tests.ports import free_port
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
    """A real HTTP receiver on 127.0.0.1: answers 503 to its first `fail_first` deliveries, then `status` (with
    a Location header when `location` is given), each after `delay` seconds; records every delivery (headers,
    body, answer) in the order they arrive. With `tls`, it is an https receiver with that server context."""

    def __init__(
        self,
        *,
        fail_first: int = 0,
        delay: float = 0.0,
        status: int = 200,
        location: str | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.deliveries: list[Delivery] = []
        lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                time.sleep(delay)
                with lock:
                    answer = 503 if len(receiver.deliveries) < fail_first else status
                    headers = {name.lower(): value for name, value in self.headers.items()}
                    receiver.deliveries.append(Delivery(headers, body, answer))
                self.send_response(answer)
                if location:
                    self.send_header("location", location)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_port
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}/hooks"

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
    return f"http://127.0.0.1:{free_port()}/hooks"


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
    """Settings that sign events and allow receivers on 127.0.0.1 (the tests' receivers)."""
    return settings.model_copy(
        update={"webhook_secret": SecretStr(SECRET), "webhook_allowed_hosts": LOOPBACK, **update}
    )


LOOPBACK = "127.0.0.1"
"""MAS_WEBHOOK_ALLOWED_HOSTS of the tests whose receivers listen on 127.0.0.1."""


# --- across a gpu worker killed mid-render ---------------------------------------------------------------


@pytest.fixture
def data_dir():
    with tempfile.TemporaryDirectory(prefix="mas-webhooks-") as tmp:
        Path(tmp).chmod(0o755)  # as root, the embedded PostgreSQL runs as another user that must enter it
        yield Path(tmp)


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
            MAS_WEBHOOK_ALLOWED_HOSTS=LOOPBACK,
        ) as studio,
    ):
        studio.worker("cpu", concurrency=2)
        gpu = studio.worker("gpu")
        studio.beat()
        batch_id = studio.enqueue("Create 4 videos of harbour cranes")
        lease, result = studio.kill_mid_render(gpu, batch_id)
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
    batch_id = production.submit(settings, STUDIO, parse_request("Create 2 videos of rope bridges", settings), notify_url=down)

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
        claimed, unreadable = webhooks._claim(settings, limit=50)  # ... and the deliverer dies here
        assert [c.id for c in claimed] == ids and unreadable == []
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


def _cli(*args: str, secret: str | None = SECRET, allowed: str | None = LOOPBACK):
    env = {"MAS_WEBHOOK_SECRET": secret, "MAS_WEBHOOK_ALLOWED_HOSTS": allowed, "COLUMNS": "200"}
    return CliRunner().invoke(main, list(args), env=env)


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
        (
            ("enqueue", "--at", "03:00", "--notify", "file:///etc/passwd", "Create 2 videos of kites"),
            SECRET,
            "not an http(s)",
        ),
    ):
        result = _cli(*args, secret=secret)
        assert result.exit_code == 2, result.output
        assert says in result.output and "Traceback" not in result.output
    assert (_count(clean, Batch), _count(clean, Schedule)) == (batches, schedules)


# --- where a webhook may go (mas.outbox.targets) -----------------------------------------------------------


def test_a_receiver_on_loopback_without_the_allowance_is_refused_at_submit_and_nothing_is_stored(clean):
    """Without MAS_WEBHOOK_ALLOWED_HOSTS a receiver on this machine, in whatever form its host is written, is
    refused when a batch or a schedule names it, by the core and by the command line: one line naming the URL,
    the address and the setting; no batch, schedule or event stored, nothing sent."""
    from mas.domain.requests import parse_request
    from mas.errors import InvalidInput
    from mas.pipeline import production

    settings = clean.model_copy(update={"webhook_secret": SecretStr(SECRET)})
    assert settings.webhooks.allowed_hosts == ()
    request = parse_request("Create 2 videos of kites", settings)
    later = datetime.now(UTC) + timedelta(hours=1)
    with Receiver() as receiver:
        for host in ("127.0.0.1", "localhost", "2130706433", "127.1", "[::ffff:127.0.0.1]"):
            url = receiver.url.replace("127.0.0.1", host)
            with pytest.raises(InvalidInput, match=r"resolves to a loopback address .*MAS_WEBHOOK_ALLOWED_HOSTS"):
                production.submit(settings, STUDIO, request, notify_url=url)
            with pytest.raises(InvalidInput, match="loopback"):
                production.schedule(settings, STUDIO, request, run_at=later, notify_url=url)
        for args in (("enqueue", "--notify", receiver.url, "Create 2 videos of kites"),
                     ("enqueue", "--at", "03:00", "--notify", receiver.url, "Create 2 videos of kites")):  # fmt: skip
            result = _cli(*args, allowed=None)
            assert result.exit_code == 2, result.output
            assert f"the webhook URL '{receiver.url}' resolves to a loopback address 127.0.0.1" in result.output
            assert "MAS_WEBHOOK_ALLOWED_HOSTS" in result.output and "Traceback" not in result.output
    assert not receiver.deliveries
    assert (_count(clean, Batch), _count(clean, Schedule), _count(clean, WebhookEvent)) == (0, 0, 0)


def test_each_delivery_checks_the_receivers_address_again_and_connects_to_the_address_checked(clean):
    """Events whose receiver passed when they were submitted are checked again when sent. On loopback without
    the allowance they are given up at the first try, the reason kept, nothing sent; so is a name the (injected)
    DNS answers with a public address at submit and with 127.0.0.1 at delivery. With the allowance, a name only
    the injected DNS knows is delivered to the address it resolved to (no other lookup could find it), the Host
    header naming it; a name that does not resolve is tried again later."""
    from mas.pipeline.production import check_notify_url

    settings = clean.model_copy(update={"webhook_secret": SecretStr(SECRET)})
    with Receiver() as receiver:
        rebound = f"http://hooks.rebind.test:{receiver.port}/hooks"
        dns = Dns(hooks_rebind_test=[["93.184.216.34"], ["127.0.0.1"]], hooks_pinned_test="127.0.0.1")
        assert check_notify_url(settings, STUDIO, rebound, resolver=dns) == rebound  # public when submitted
        refused = _add_events(settings, url=receiver.url, batches=2, each=1)
        refused += _add_events(settings, url=rebound, batches=1, each=1)
        report = webhooks.deliver_due(settings, resolver=dns)
        assert sorted(report.failed) == sorted(refused) and not report.delivered and not report.retrying
        assert not receiver.deliveries
        for event in _events(settings):
            assert event.failed_at is not None and event.attempts == 1 and event.delivered_at is None
            assert event.last_error == (
                "refused: the receiver resolves to a loopback address 127.0.0.1; allow it with "
                "MAS_WEBHOOK_ALLOWED_HOSTS"
            )

        allowed = settings.changed(webhook_allowed_hosts="127.0.0.0/8")
        (pinned,) = _add_events(allowed, url=f"http://hooks.pinned.test:{receiver.port}/hooks", batches=1, each=1)
        (gone,) = _add_events(allowed, url=f"http://gone.test:{receiver.port}/hooks", batches=1, each=1)
        report = webhooks.deliver_due(allowed, resolver=dns)
    assert report.delivered == [pinned] and report.retrying == [gone] and not report.failed
    assert [(d.id, d.headers["host"]) for d in receiver.deliveries] == [(pinned, f"hooks.pinned.test:{receiver.port}")]
    (later,) = [e for e in _events(settings) if e.id == gone]
    assert later.failed_at is None and later.attempts == 1
    assert later.last_error == "the receiver has a host name that does not resolve now"


def test_a_redirect_is_not_followed(clean):
    """A receiver answering 307 to elsewhere has failed this try: the deliverer does not go where it points."""
    settings = _with_webhooks(clean)
    with Receiver() as elsewhere, Receiver(status=307, location=elsewhere.url) as redirecting:
        (event_id,) = _add_events(settings, url=redirecting.url, batches=1, each=1)
        report = webhooks.deliver_due(settings)
    assert report.retrying == [event_id] and len(redirecting.deliveries) == 1 and not elsewhere.deliveries
    (event,) = _events(settings)
    assert event.last_error == "HTTP 307" and event.delivered_at is None


def _certificate(folder: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for `name` and its key, made by the openssl command."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", f"/CN={name}",
         "-addext", f"subjectAltName=DNS:{name}"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


def test_https_to_the_checked_address_names_the_host_for_sni_and_the_certificate(clean, tmp_path, monkeypatch):
    """An https receiver is reached at the address checked while TLS names the host: the server is asked for
    receiver.test (SNI) and its certificate, valid for receiver.test only, is verified against that name (and
    trusted through SSL_CERT_FILE, as a deployment's own CA would be). Another name resolving to the same
    address is refused by the certificate: the name, not the address, is what is verified."""
    cert, key = _certificate(tmp_path, "receiver.test")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    asked: list[str | None] = []
    context.sni_callback = lambda _socket, name, _context: asked.append(name)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # read by the deliverer's client when a round makes it
    settings = _with_webhooks(clean, webhook_allowed_hosts="127.0.0.0/8")
    dns = Dns(receiver_test="127.0.0.1", impostor_test="127.0.0.1")
    with Receiver(tls=context) as receiver:
        (good,) = _add_events(settings, url=f"https://receiver.test:{receiver.port}/hooks", batches=1, each=1)
        (bad,) = _add_events(settings, url=f"https://impostor.test:{receiver.port}/hooks", batches=1, each=1)
        report = webhooks.deliver_due(settings, resolver=dns)
    assert report.delivered == [good] and report.retrying == [bad], report
    assert [(d.id, d.headers["host"]) for d in receiver.deliveries] == [(good, f"receiver.test:{receiver.port}")]
    assert sorted(set(asked)) == ["impostor.test", "receiver.test"]
    (refused,) = [e for e in _events(settings) if e.id == bad]
    assert "ConnectError" in refused.last_error and "certificate verify failed" in refused.last_error


def test_a_users_own_secret_signs_their_requests_events_and_the_studios_signs_its_own(clean):
    """A user with a secret of their own may name a receiver without the studio's secret; their request's
    receiver verifies with their secret, the studio's receiver with the studio's."""
    from mas.domain.requests import ProductionRequest
    from mas.models import User
    from mas.pipeline.production import check_notify_url, new_batch

    own = "whsec_" + base64.b64encode(os.urandom(32)).decode()
    with db.session_scope(clean) as s:
        s.add(User(name="ana", role="member", webhook_secret=own))
    with Receiver() as theirs, Receiver() as studios:
        unsigned = clean.model_copy(update={"webhook_allowed_hosts": LOOPBACK, "webhook_secret": None})
        ana = Actor("ana")
        assert check_notify_url(unsigned, ana, theirs.url) == theirs.url  # her own secret is enough
        with pytest.raises(InvalidInput, match="needs MAS_WEBHOOK_SECRET set, or the user's own secret"):
            check_notify_url(unsigned, Actor("ben"), theirs.url)
        settings = _with_webhooks(clean, webhook_url=studios.url)
        request = ProductionRequest(text="Create 1 video of owls", kind="batch", count=1, theme="owls")
        with db.session_scope(settings) as s:
            batch = new_batch(s, request, priority="normal", user="ana", notify_url=theirs.url)
            events.record(s, settings, type="batch.done", batch=batch, data={})
        assert webhooks.deliver_due(settings).tried == 2
    (to_them,), (to_studio,) = theirs.accepted(), studios.accepted()
    assert Webhook(own).verify(to_them.body, to_them.headers)["type"] == "batch.done"
    assert Webhook(SECRET).verify(to_studio.body, to_studio.headers)["type"] == "batch.done"
    with pytest.raises(Exception, match="signature"):
        Webhook(SECRET).verify(to_them.body, to_them.headers)
