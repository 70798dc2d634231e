"""The JSON API (`/api/v1`) against real PostgreSQL, Redis and workers: a client written against the OpenAPI
document submits, follows and picks; a retried submit makes one batch; credentials off loopback; bad input is a
4xx problem that changes nothing; the probes."""

from __future__ import annotations

import base64
import time
from typing import Any

import pytest
import sqlalchemy as sa
from openapi_spec_validator import validate
from pydantic import SecretStr
from starlette.testclient import TestClient

from mas.db import session_scope
from mas.gallery import GalleryError, create_app, server
from mas.models import ABSelection, Batch, IdempotencyKey, Schedule

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
    scheduled = {"request": "Create 1 video of owls", "at": "2030-01-01T02:00:00+00:00"}
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
        for at in (None, "2030-01-01T02:00:00+00:00"):
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
    assert checks["video_backend"] != "ok" and checks["postgres"] == "ok" and checks["workers"] == "ok"
