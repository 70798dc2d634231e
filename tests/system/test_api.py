"""The JSON API (`/api/v1`) against real PostgreSQL, Redis and workers: a client written against the OpenAPI
document submits, follows and picks; a retried submit makes one batch, an expired key a new one, a key left busy
by a dead process is taken over by one retry; credentials off loopback; bad input is a 4xx problem that changes
nothing; the probes, their cached answer and their words."""

from __future__ import annotations

import base64
import re
import threading
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import sqlalchemy as sa
from openapi_spec_validator import validate
from pydantic import SecretStr
from starlette.testclient import TestClient

from mas import names
from mas.api.idempotency import fingerprint
from mas.api.schemas import BatchRequest
from mas.db import session_scope
from mas.domain.identity import STUDIO
from mas.gallery import GalleryError, create_app, server
from mas.models import ABSelection, Batch, IdempotencyKey, Schedule
from tests.harness.processes import wait_for
from tests.ports import free_port

IN_A_MONTH = (datetime.now(UTC) + timedelta(days=30)).isoformat()
"""A schedule's time (within MAS_SCHEDULE_MAX_DAYS_AHEAD)."""
DEADLINE_S = 600  # a few preview renders; long only on a loaded 2-core machine (the wait ends when done)


class StudioClient:
    """A client written against the OpenAPI document: it finds each operation's method and path there (by
    operationId), so a route the document does not describe cannot be called."""

    def __init__(self, http: TestClient, headers: dict[str, str] | None = None) -> None:
        self.http, self.headers = http, headers or {}
        document = http.get("/api/v1/openapi.json", headers=self.headers).json()
        self.operations = {
            op["operationId"]: (method.upper(), path)
            for path, item in document["paths"].items()
            for method, op in item.items()
        }

    def call(self, operation: str, *, body: Any = None, headers: dict[str, str] | None = None, **params: Any):
        method, path = self.operations[operation]
        return self.http.request(
            method, "/api/v1" + path.format(**params), json=body, headers={**self.headers, **(headers or {})}
        )

    def wait(self, operation: str, done, **params: Any) -> dict:
        deadline = time.monotonic() + DEADLINE_S
        while True:
            reply = self.call(operation, **params)
            assert reply.status_code == 200, reply.text
            if done(reply.json()):
                return reply.json()
            assert time.monotonic() < deadline, reply.text
            time.sleep(0.5)


def op(client: StudioClient, name: str) -> str:
    """The operationId FastAPI gave the route function `name`."""
    return next(key for key in client.operations if key.startswith(name + "_"))


@pytest.fixture
def http(clean) -> TestClient:
    return TestClient(create_app(clean), raise_server_exceptions=False)


def test_the_openapi_document_is_valid_and_names_every_route_and_the_credentials(http):
    document = http.get("/api/v1/openapi.json").json()
    validate(document)  # what client generators read
    paths = set(document["paths"])
    assert {"/batches", "/batches/{batch_id}", "/batches/{batch_id}/{action}", "/videos/{video_id}",
            "/videos/{video_id}/file", "/ab/{test_id}", "/ab/{test_id}/pick", "/memory/blocks",
            "/memory/blocks/{label}"} <= paths  # fmt: skip
    schemes = {scheme["scheme"] for scheme in document["components"]["securitySchemes"].values()}
    assert schemes == {"basic", "bearer"}
    assert "Idempotency-Key" in str(document["paths"]["/batches"]["post"]["parameters"])


@pytest.mark.usefixtures("workers")
def test_a_client_written_against_the_document_submits_follows_and_picks(http):
    client = StudioClient(http)
    submitted = client.call(op(client, "submit"), body={"request": "Create 2 videos of paper boats"})
    assert submitted.status_code == 201, submitted.text
    batch_id = submitted.json()["batch_id"]
    assert submitted.headers["location"] == f"/api/v1/batches/{batch_id}"
    batch = client.wait(op(client, "get_batch"), lambda b: b["status"] == "done", batch_id=batch_id)
    assert batch["total"] == 2 and batch["done"] == 2 and len(batch["videos"]) == 2
    video = client.call(op(client, "get_video"), video_id=batch["videos"][0]["id"]).json()
    assert video["attempt_history"] and video["attempt_history"][0]["prompt"]
    mp4 = client.call(op(client, "video_file"), video_id=video["id"])
    assert mp4.status_code == 200 and mp4.headers["content-type"] == "video/mp4" and len(mp4.content) > 1000

    ab = client.call(op(client, "submit"), body={"kind": "ab", "concept": "a heron at dawn", "count": 2})
    assert ab.status_code == 201, ab.text
    ab_batch = client.wait(op(client, "get_batch"), lambda b: b["status"] == "done", batch_id=ab.json()["batch_id"])
    test = client.wait(op(client, "get_ab_test"), lambda t: t["ready"], test_id=ab_batch["ab_test_id"])
    assert [v["label"] for v in test["variations"]] == ["A", "B"]
    picked = client.call(op(client, "pick_winner"), body={"label": "B"}, test_id=test["id"])
    assert picked.status_code == 200, picked.text
    assert picked.json()["status"] == "closed" and picked.json()["winner"] == "B"
    again = client.call(op(client, "pick_winner"), body={"label": "A"}, test_id=test["id"])
    assert again.status_code == 409 and again.json()["retryable"] is False  # closed: nothing changed
    blocks = client.call(op(client, "memory_block"), label="ab_testing").json()
    assert blocks["USER_SELECTIONS"]


def test_a_retried_submit_with_the_same_key_makes_one_batch(http, clean):
    client = StudioClient(http)
    body = {"request": "Create 1 video of tide pools", "priority": "normal"}
    first = client.call(op(client, "submit"), body=body, headers={"Idempotency-Key": "order-42"})
    again = client.call(op(client, "submit"), body=body, headers={"Idempotency-Key": "order-42"})
    assert first.status_code == 201 and again.status_code == 200, (first.text, again.text)
    assert again.json() == {**first.json(), "replayed": True}
    other = client.call(op(client, "submit"), body={**body, "request": "Create 2 videos of tide pools"},
                        headers={"Idempotency-Key": "order-42"})  # fmt: skip
    assert other.status_code == 422 and "another request" in other.json()["detail"]
    scheduled = {"request": "Create 1 video of owls", "at": IN_A_MONTH}
    later = [client.call(op(client, "submit"), body=scheduled, headers={"Idempotency-Key": "night"}) for _ in "ab"]
    assert later[0].json()["schedule_id"] == later[1].json()["schedule_id"] is not None
    with session_scope(clean) as session:
        assert session.scalar(sa.select(sa.func.count()).select_from(Batch)) == 1
        assert session.scalar(sa.select(sa.func.count()).select_from(Schedule)) == 1


def test_the_api_refuses_calls_without_credentials_off_loopback(clean):
    settings = clean.model_copy(update={"gallery_user": "ana", "gallery_password": SecretStr("pw"),
                                        "api_token": SecretStr("tok-123")})  # fmt: skip
    http = TestClient(create_app(settings), raise_server_exceptions=False)
    refused = http.get("/api/v1/batches")
    assert refused.status_code == 401 and refused.headers["content-type"] == "application/problem+json"
    assert http.get("/api/v1/batches", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert http.get("/api/v1/batches", headers={"Authorization": "Bearer tok-123"}).status_code == 200
    basic = "Basic " + base64.b64encode(b"ana:pw").decode()
    assert http.get("/api/v1/batches", headers={"Authorization": basic}).status_code == 200
    assert http.get("/healthz").status_code == 200  # probes need no credentials
    forged = http.post("/api/v1/batches/1/cancel", headers={"Authorization": basic, "Origin": "https://evil.test"})
    assert forged.status_code == 403  # a page of another site cannot make the browser act
    assert http.get("/metrics").status_code == 401
    with pytest.raises(GalleryError, match="without credentials"):
        server(clean, host="0.0.0.0")
    server(clean.model_copy(update={"api_token": SecretStr("tok")}), host="0.0.0.0")  # a token is enough


BAD_REQUESTS = [
    ("post", "/batches", {}, 422),
    ("post", "/batches", {"request": ""}, 422),
    ("post", "/batches", {"request": "make something nice"}, 422),
    ("post", "/batches", {"request": "Create 100000 videos of cats"}, 422),
    ("post", "/batches", {"request": "Create 2 videos of cats", "surprise": 1}, 422),
    ("post", "/batches", {"theme": "cats", "count": 0}, 422),
    ("post", "/batches", {"kind": "series", "count": 2}, 422),
    ("post", "/batches", {"kind": "ab", "concept": "x", "count": 99}, 422),
    ("post", "/batches", {"request": "Create 2 videos of cats", "user": "bad user!"}, 422),
    ("post", "/batches", {"request": "Create 2 videos of cats", "at": "2030-01-01T02:00:00"}, 422),
    ("post", "/batches", {"request": "Create 2 videos of cats", "at": "tomorrow"}, 422),
    ("post", "/batches", {"request": "Create 2 videos of cats", "notify_url": "file:///etc/passwd"}, 422),
    ("post", "/batches", {"request": "Create 2 videos of cats\x00"}, 422),
    ("post", "/batches", "not json", 422),
    ("get", "/batches?status=sleeping", None, 422),
    ("get", "/batches?limit=0", None, 422),
    ("get", "/batches/99999999999", None, 404),
    ("get", "/batches/abc", None, 422),
    ("post", "/batches/1/explode", None, 404),
    ("post", "/batches/123456/cancel", None, 404),
    ("get", "/videos/123456", None, 404),
    ("get", "/videos/123456/file", None, 404),
    ("get", "/ab/123456", None, 404),
    ("post", "/ab/123456/pick", {"label": "A"}, 404),
    ("post", "/ab/1/pick", {"label": ""}, 422),
    ("get", "/memory/blocks/nope", None, 404),
    ("get", "/memory/blocks?user=../../etc", None, 422),
    ("get", "/nowhere", None, 404),
]


@pytest.mark.parametrize(("method", "path", "body", "status"), BAD_REQUESTS)
def test_bad_input_over_the_api_is_a_problem_and_changes_nothing(http, clean, method, path, body, status):
    kwargs: dict[str, Any] = {"content": body} if isinstance(body, str) else {"json": body}
    reply = http.request(method.upper(), "/api/v1" + path, **kwargs)
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"] == "application/problem+json"
    problem = reply.json()
    assert problem["status"] == status and problem["detail"] and problem["retryable"] is False
    with session_scope(clean) as session:
        for table in (Batch, Schedule, IdempotencyKey, ABSelection):
            assert session.scalar(sa.select(sa.func.count()).select_from(table)) == 0


WEBHOOK_SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()


def test_a_webhook_receiver_on_an_internal_address_is_a_problem_and_stores_nothing(clean):
    """A notify_url whose host resolves to loopback, link-local (a cloud's metadata service) or a private
    address is refused, now or as a schedule, naming why and the setting that would allow it."""
    http = TestClient(create_app(clean.model_copy(update={"webhook_secret": SecretStr(WEBHOOK_SECRET)})))
    for url, why in (
        ("http://127.0.0.1:9/hooks", "a loopback address 127.0.0.1"),
        ("http://169.254.169.254/latest/meta-data/", "a link-local address 169.254.169.254"),
        ("http://[::ffff:10.0.0.1]/hooks", "a private address ::ffff:a00:1 (IPv4 10.0.0.1)"),
    ):
        for at in (None, IN_A_MONTH):
            body = {"request": "Create 2 videos of cats", "notify_url": url, "at": at}
            reply = http.post("/api/v1/batches", json=body)
            assert reply.status_code == 422, reply.text
            problem = reply.json()
            assert f"resolves to {why}" in problem["detail"] and "MAS_WEBHOOK_ALLOWED_HOSTS" in problem["detail"]
            assert problem["retryable"] is False
    with session_scope(clean) as session:
        for table in (Batch, Schedule, IdempotencyKey):
            assert session.scalar(sa.select(sa.func.count()).select_from(table)) == 0


@pytest.mark.usefixtures("workers")
def test_readyz_names_what_is_not_ready(http, clean):
    ready = http.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert set(ready.json()["checks"].values()) == {"ok"}
    broken = clean.model_copy(update={"video_backend": "comfyui", "comfyui_url": "http://127.0.0.1:9"})
    not_ready = TestClient(create_app(broken)).get("/readyz")
    assert not_ready.status_code == 503
    checks = not_ready.json()["checks"]
    assert checks["video_backend"] == "not reachable" and checks["postgres"] == "ok" and checks["workers"] == "ok"


def test_the_operator_makes_users_and_keys_and_the_key_decides_who_acts(clean):
    """`mas users` makes the credentials; a member's submit is theirs whatever the body says, and naming
    another user is refused with nothing stored; an admin acts for the user it names."""
    from click.testing import CliRunner

    from mas.cli import main
    from mas.models import ApiKey

    cli = CliRunner()
    made = cli.invoke(main, ["users", "add", "alice"])
    assert made.exit_code == 0, made.output
    alice = made.stdout.strip().splitlines()[0]
    assert re.fullmatch(r"mas_[0-9a-f]{12}_[A-Za-z0-9_-]{43}", alice)
    again = cli.invoke(main, ["users", "add", "alice"])
    assert again.exit_code != 0 and "already a user 'alice'" in again.output
    root = cli.invoke(main, ["users", "add", "root", "--admin"]).stdout.strip().splitlines()[0]
    with session_scope(clean) as session:
        stored = session.scalars(sa.select(ApiKey.secret_hash)).all()
    assert len(stored) == 2 and not any(h in alice or h in root for h in stored)  # only hashes kept
    listed = cli.invoke(main, ["users", "list"]).output
    assert re.search(r"alice\s+│?\s*member\s+│?\s*1\b", listed) and re.search(r"root\s+│?\s*admin", listed), listed

    http = TestClient(create_app(clean), raise_server_exceptions=False)
    as_alice, as_root = {"Authorization": f"Bearer {alice}"}, {"Authorization": f"Bearer {root}"}
    refused = http.post("/api/v1/batches", json={"theme": "owls", "count": 1, "user": "bob"}, headers=as_alice)
    assert refused.status_code == 403 and refused.json()["retryable"] is False
    with session_scope(clean) as session:
        assert session.scalar(sa.select(sa.func.count()).select_from(Batch)) == 0
    mine = http.post("/api/v1/batches", json={"theme": "owls", "count": 1}, headers=as_alice)
    for_bob = http.post("/api/v1/batches", json={"theme": "cranes", "count": 1, "user": "bob"}, headers=as_root)
    assert mine.status_code == for_bob.status_code == 201, (mine.text, for_bob.text)
    with session_scope(clean) as session:
        owners = dict(session.execute(sa.select(Batch.id, Batch.user_name)).all())
    assert owners == {mine.json()["batch_id"]: "alice", for_bob.json()["batch_id"]: "bob"}

    second = cli.invoke(main, ["users", "keys", "alice", "--expires-days", "1"]).stdout.strip().splitlines()[0]
    key_id = second.split("_")[1]
    assert cli.invoke(main, ["users", "revoke", "alice", key_id]).output.startswith("revoked 1 key of alice")
    assert http.get("/api/v1/batches", headers={"Authorization": f"Bearer {second}"}).status_code == 401
    assert http.get("/api/v1/batches", headers=as_alice).status_code == 200  # her first key still works
    unknown = cli.invoke(main, ["users", "revoke", "nobody"])
    assert unknown.exit_code != 0 and "there is no user 'nobody'" in unknown.output


# --- Idempotency-Keys that expire or were left busy -----------------------------------------------------

TIDE_POOLS = {"request": "Create 1 video of tide pools", "priority": "normal"}


def _submit(http: TestClient, key: str, body: dict = TIDE_POOLS):
    return http.post("/api/v1/batches", json=body, headers={"Idempotency-Key": key})


def _age(settings, key: str, by: timedelta) -> None:
    """Make the key's claim `by` older, as if it had been made that long ago."""
    with session_scope(settings) as session:
        session.execute(
            sa.update(IdempotencyKey).where(IdempotencyKey.key == key).values(created_at=IdempotencyKey.created_at - by)
        )


def _count(settings, table) -> int:
    with session_scope(settings) as session:
        return session.scalar(sa.select(sa.func.count()).select_from(table))


def test_an_expired_key_counts_as_never_used(clean):
    settings = clean.changed(idempotency_key_hours=1)
    http = TestClient(create_app(settings), raise_server_exceptions=False)
    first = _submit(http, "order-7")
    _age(settings, "order-7", timedelta(minutes=59))
    replayed = _submit(http, "order-7")
    assert first.status_code == 201 and replayed.status_code == 200, (first.text, replayed.text)
    assert replayed.json()["batch_id"] == first.json()["batch_id"]  # not yet expired: the same batch
    _age(settings, "order-7", timedelta(minutes=2))
    renewed = _submit(http, "order-7")
    assert renewed.status_code == 201, renewed.text
    assert renewed.json()["batch_id"] != first.json()["batch_id"] and _count(settings, Batch) == 2
    assert _submit(http, "order-7").json() == {**renewed.json(), "replayed": True}  # the key is the new batch's
    _age(settings, "order-7", timedelta(hours=2))
    other = _submit(http, "order-7", {**TIDE_POOLS, "request": "Create 1 video of owls"})
    assert other.status_code == 201, other.text  # expired: not "used for another request"


def _left_busy(settings, key: str, body: dict) -> None:
    """The key as a submit that died between its claim and its end leaves it: claimed, with no batch."""
    with session_scope(settings) as session:
        digest = fingerprint(BatchRequest(**body).model_dump(mode="json"))
        session.add(IdempotencyKey(user_name=STUDIO.user, key=key, request_hash=digest))


def _waiting_on_keys(engine: sa.Engine) -> int:
    """Statements on the keys waiting for a lock (asked in a transaction of its own: the view is a snapshot)."""
    with engine.connect() as conn:
        return conn.execute(
            sa.text(
                "select count(*) from pg_stat_activity where wait_event_type = 'Lock' and query ilike '%idempotency_keys%'"
            )
        ).scalar_one()


def test_a_key_left_busy_answers_busy_until_its_bound_then_one_retry_takes_it(clean, engine):
    settings = clean.changed(idempotency_busy_seconds=60)
    _left_busy(settings, "order-9", TIDE_POOLS)
    busy = _submit(TestClient(create_app(settings), raise_server_exceptions=False), "order-9")
    assert busy.status_code == 409 and busy.json()["retryable"] is True, busy.text
    assert "still being submitted" in busy.json()["detail"] and _count(settings, Batch) == 0
    _age(settings, "order-9", timedelta(seconds=61))

    # two retries at once: both wait on the row (held here) and are let go together
    replies: list[Any] = []
    retries = [
        threading.Thread(target=lambda: replies.append(_submit(TestClient(create_app(settings)), "order-9")))
        for _ in range(2)
    ]
    with engine.connect() as conn, conn.begin():
        conn.execute(sa.select(IdempotencyKey).where(IdempotencyKey.key == "order-9").with_for_update())
        for retry in retries:
            retry.start()
        wait_for(lambda: _waiting_on_keys(engine) == 2, timeout=60, what="both retries waiting on the key")
    for retry in retries:
        retry.join(60)
    statuses = sorted(reply.status_code for reply in replies)
    assert statuses in ([200, 201], [201, 409]), [reply.text for reply in replies]  # the other: done, or busy
    made = next(reply.json() for reply in replies if reply.status_code == 201)
    assert _count(settings, Batch) == 1
    with session_scope(settings) as session:
        assert session.get_one(IdempotencyKey, (STUDIO.user, "order-9")).batch_id == made["batch_id"]


def test_the_maintenance_job_deletes_only_expired_keys(clean):
    import beat_schedule
    from mas.runtime.app import Studio

    settings = clean.changed(idempotency_key_hours=1)
    with session_scope(settings) as session:
        for key, batch_id in (("old-done", 1), ("old-busy", None), ("young", 2), ("young-busy", None)):
            session.add(IdempotencyKey(user_name=STUDIO.user, key=key, request_hash="h", batch_id=batch_id))
    _age(settings, "old-done", timedelta(minutes=61))
    _age(settings, "old-busy", timedelta(hours=30))
    _age(settings, "young", timedelta(minutes=59))
    app = Studio(settings, set_as_current=False)
    app.loader.import_default_modules()
    assert app.tasks[names.EXPIRE_IDEMPOTENCY_KEYS].apply().get(timeout=60) == 2
    with session_scope(settings) as session:
        assert set(session.scalars(sa.select(IdempotencyKey.key))) == {"young", "young-busy"}
    jobs = {job["task"] for job in beat_schedule.schedule(settings).values()}
    assert names.EXPIRE_IDEMPOTENCY_KEYS in jobs


# --- /readyz: cached, and in words ----------------------------------------------------------------------


class Endpoint:
    """A real HTTP server standing in for an endpoint /readyz asks: every GET answers `status`, counted."""

    def __init__(self, status: int = 200) -> None:
        outer = self
        self.status, self.asked = status, 0

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                outer.asked += 1
                self.send_response(outer.status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_readyz_answers_from_its_last_checks_for_a_few_seconds(clean):
    endpoint = Endpoint()
    window = 5.0
    settings = clean.changed(agent_backend="llm", llm_url=endpoint.url + "/v1", ready_cache_seconds=window)
    http = TestClient(create_app(settings))
    try:
        asked = time.monotonic()  # the answer is at least this new
        assert http.get("/readyz").json()["checks"]["agent_endpoint"] == "ok" and endpoint.asked == 1
        checked = time.monotonic()  # and at most this old
    finally:
        endpoint.stop()
    cached = http.get("/readyz").json()["checks"]
    assert time.monotonic() - checked < window, "the machine was too slow to ask again within the window"
    assert cached["agent_endpoint"] == "ok" and endpoint.asked == 1  # the checks did not run again
    wait_for(lambda: http.get("/readyz").json()["checks"]["agent_endpoint"] == "not reachable",
             timeout=window + 60, what="the stopped endpoint reported once the window passed")  # fmt: skip
    assert time.monotonic() - asked >= window  # not before the window passed


def test_readyz_names_what_fails_without_exception_text(clean, caplog):
    comfyui = Endpoint(status=500)
    closed = f"http://127.0.0.1:{free_port('127.0.0.1')}/v1"  # nothing listens there
    settings = clean.changed(video_backend="comfyui", comfyui_url=comfyui.url, agent_backend="llm", llm_url=closed)
    try:
        with caplog.at_level("WARNING", logger="mas.api.health"):
            reply = TestClient(create_app(settings)).get("/readyz")
    finally:
        comfyui.stop()
    assert reply.status_code == 503
    checks = reply.json()["checks"]
    assert checks["video_backend"] == "answered 500" and checks["agent_endpoint"] == "not reachable"
    assert checks["postgres"] == "ok" and checks["redis"] == "ok"
    for text in ("Error", "Errno", "Exception", "127.0.0.1"):
        assert text not in reply.text
    assert "ConnectError" in caplog.text and "HTTPStatusError" in caplog.text  # the detail is in the log
