"""Bounds at the edge, logins and framing, against real PostgreSQL and Redis: a schedule's time within its bounds,
ids past the database's integer, control characters and wrong JSON types are each a 4xx that stores nothing;
failed logins are throttled per user and per address without running the password's hash; every response carries
the headers that keep other sites from framing the gallery's buttons."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import sqlalchemy as sa
from pydantic import SecretStr
from starlette.testclient import TestClient

from mas.accounts import secrets as stored
from mas.accounts import users
from mas.db import session_scope
from mas.gallery import create_app
from mas.models import Batch, IdempotencyKey, Schedule
from tests.harness.gallery import served_gallery

MISSING = 987654
"""An id no row has: the answer every id out of the database's range must match."""


@pytest.fixture
def http(clean) -> TestClient:
    return TestClient(create_app(clean), raise_server_exceptions=False)


def stored_nothing(settings) -> None:
    with session_scope(settings) as session:
        for table in (Batch, Schedule, IdempotencyKey):
            assert session.scalar(sa.select(sa.func.count()).select_from(table)) == 0, table


def is_problem(reply, status: int) -> dict:
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"] == "application/problem+json", reply.text
    return reply.json()


def _at(delta: timedelta) -> str:
    return (datetime.now(UTC) + delta).isoformat()


# --- a schedule's time ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "at",
    ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "+400 days", "-3 days"],
)
def test_a_schedule_time_out_of_its_bounds_is_refused_and_stores_nothing(http, clean, at):
    if at.endswith("days"):
        at = _at(timedelta(days=int(at.split()[0])))
    reply = http.post("/api/v1/batches", json={"request": "Create 2 videos of owls", "at": at})
    problem = is_problem(reply, 422)
    assert "MAS_SCHEDULE_MAX_DAYS_AHEAD" in problem["detail"], problem
    stored_nothing(clean)


def test_a_schedule_within_its_bounds_is_kept_and_one_just_past_starts_at_once(http, clean):
    from mas.pipeline import production

    later = http.post("/api/v1/batches", json={"request": "Create 2 videos of owls", "at": _at(timedelta(days=300))})
    assert later.status_code == 201 and later.json()["schedule_id"] is not None, later.text
    just_past = http.post("/api/v1/batches", json={"theme": "moths", "count": 1, "at": _at(-timedelta(hours=1))})
    assert just_past.status_code == 201, just_past.text
    assert len(production.run_due_schedules(clean)) == 1  # the past one, now; the later one waits
    closer = TestClient(create_app(clean.changed(schedule_max_days_ahead=1)), raise_server_exceptions=False)
    refused = closer.post("/api/v1/batches", json={"theme": "owls", "count": 1, "at": _at(timedelta(days=2))})
    assert "1 days ahead" in is_problem(refused, 422)["detail"]


# --- ids past the column ----------------------------------------------------------------------------

ID_ROUTES = [
    ("GET", "/api/v1/batches/{}", None),
    ("POST", "/api/v1/batches/{}/cancel", None),
    ("POST", "/api/v1/batches/{}/pause", None),
    ("GET", "/api/v1/videos/{}", None),
    ("GET", "/api/v1/videos/{}/file", None),
    ("GET", "/api/v1/ab/{}", None),
    ("POST", "/api/v1/ab/{}/pick", {"label": "A"}),
    ("GET", "/api/v1/batches/{}/events", None),
]


@pytest.mark.parametrize(("method", "template", "body"), ID_ROUTES, ids=[f"{m} {t}" for m, t, _ in ID_ROUTES])
def test_an_id_past_the_database_integer_is_not_found_as_a_missing_one(http, method, template, body):
    missing = is_problem(http.request(method, template.format(MISSING), json=body), 404)
    for given in (-2147483649, -2147483648, -1, 0, 2147483648, -(10**30), 10**30):
        said = is_problem(http.request(method, template.format(given), json=body), 404)
        assert said == {**missing, "detail": missing["detail"].replace(str(MISSING), str(given))}


@pytest.mark.parametrize("path", ["/batches/-2147483649", "/batches/-1", "/ab/0", "/series/2147483648",
                                  "/videos/-5/frames.jpg", "/batches/-2147483649/cancel"])  # fmt: skip
def test_a_gallery_page_past_the_database_integer_is_not_found(http, path):
    reply = http.request("POST" if path.endswith("cancel") else "GET", path)
    assert reply.status_code == 404 and "there is no" in reply.text


# --- control characters and lengths -----------------------------------------------------------------


def test_a_nul_in_a_file_path_is_not_found_to_a_member_and_an_admin(clean):
    keys = {"bob": users.add(clean, "bob"), "root": users.add(clean, "root", role="admin")}
    http = TestClient(create_app(clean), raise_server_exceptions=False)
    for key in keys.values():
        for path in ("/files/x%00.mp4", "/files/x%01.mp4", "/files/batch-1/a%0ab.mp4", "/files/%00"):
            reply = http.get(path, headers={"Authorization": f"Bearer {key}"})
            assert reply.status_code == 404 and re.search("there is no page|no file", reply.text), (path, reply.text)


BASE = {"request": {}, "theme": {"count": 1}, "series_name": {"kind": "series"}, "concept": {"kind": "ab"},
        "user": {"request": "Create 2 videos of owls"}, "notify_url": {"request": "Create 2 videos of owls"}}  # fmt: skip


@pytest.mark.parametrize("field", list(BASE))
@pytest.mark.parametrize("bad", ["owls\x00", "owls\x1b[31m", "\x7f", "\ud800"])
def test_a_control_character_in_any_field_is_refused_and_stores_nothing(http, clean, field, bad):
    body = json.dumps({**BASE[field], field: bad})  # escaped: a lone surrogate is valid JSON, not valid UTF-8
    reply = http.post("/api/v1/batches", content=body, headers={"Content-Type": "application/json"})
    problem = is_problem(reply, 422)
    assert [error["where"] for error in problem["errors"]] == [f"body.{field}"], problem
    stored_nothing(clean)


def test_a_control_character_or_an_overlong_value_elsewhere_is_refused(http, clean):
    pick = f"/api/v1/ab/{MISSING}/pick"
    assert "label" in is_problem(http.post(pick, json={"label": "A\x00"}), 422)["detail"]
    assert "user" in is_problem(http.post(pick, json={"label": "A", "user": "x\x00"}), 422)["detail"]
    is_problem(http.post("/api/v1/batches", json={"theme": "o" * 100_001, "count": 1}), 422)
    is_problem(http.post("/api/v1/batches", json={"request": "Create 2 videos of owls", "user": "u" * 41}), 422)
    is_problem(http.get("/api/v1/memory/blocks?user=a%00b"), 422)
    is_problem(http.get("/api/v1/events?user=a%00b"), 422)
    stored_nothing(clean)


# --- strict JSON types ------------------------------------------------------------------------------

WRONG_TYPES = [
    ({"theme": "cats", "count": True}, "count"),
    ({"theme": "cats", "count": "3"}, "count"),
    ({"theme": "cats", "count": 2.0}, "count"),
    ({"kind": "ab", "concept": "a fox", "count": "2"}, "count"),
    ({"request": 5}, "request"),
    ({"theme": ["cats"], "count": 1}, "theme"),
    ({"request": "Create 2 videos of cats", "at": 1900000000}, "at"),
    ({"request": "Create 2 videos of cats", "priority": 1}, "priority"),
]


@pytest.mark.parametrize(("body", "field"), WRONG_TYPES, ids=[str(b) for b, _ in WRONG_TYPES])
def test_a_wrong_json_type_is_refused_not_coerced(http, clean, body, field):
    problem = is_problem(http.post("/api/v1/batches", json=body), 422)
    assert f"body.{field}" in [error["where"] for error in problem["errors"]], problem
    stored_nothing(clean)


def test_the_right_json_types_still_pass(http, clean):
    made = http.post("/api/v1/batches", json={"theme": "cats", "count": 2, "priority": "high"})
    assert made.status_code == 201, made.text
    with session_scope(clean) as session:
        assert session.scalar(sa.select(Batch.total)) == 2
    refused = is_problem(http.post(f"/api/v1/ab/{MISSING}/pick", json={"label": 1}), 422)
    assert refused["errors"][0]["where"] == "body.label"


# --- failed logins ------------------------------------------------------------------------------------

PASSWORD = "a long enough password"


@pytest.fixture
def hashes(monkeypatch) -> list[str]:
    """Every password checked against a stored hash (scrypt), in order."""
    checked: list[str] = []
    real = stored.password_matches

    def counted(password: str, hashed: str) -> bool:
        checked.append(password)
        return real(password, hashed)

    monkeypatch.setattr(stored, "password_matches", counted)
    return checked


def test_failed_logins_of_one_user_are_throttled_before_the_hash_runs(clean, hashes):
    users.add(clean, "bob")
    users.set_password(clean, "bob", PASSWORD)
    settings = clean.changed(login_failures_per_user=3, login_failures_per_address=100, login_window_seconds=60)
    one, other = (TestClient(create_app(settings), raise_server_exceptions=False, client=(f"10.0.0.{n}", 5000))
                  for n in (1, 2))  # fmt: skip  # two servers, two clients: the counts are shared in Redis
    assert one.get("/", auth=("bob", PASSWORD)).status_code == 200
    for _ in range(3):
        assert one.get("/", auth=("bob", "a wrong password!")).status_code == 401
    checked = len(hashes)
    for http, path in ((one, "/"), (other, "/"), (other, "/api/v1/batches")):
        for password in ("a wrong password!", PASSWORD):  # the right one too: no guess is checked now
            refused = http.get(path, auth=("bob", password))
            assert refused.status_code == 429, refused.text
            assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert len(hashes) == checked  # no hash ran for a refused login
    assert is_problem(other.get("/api/v1/batches", auth=("bob", PASSWORD)), 429)["retryable"] is True
    assert one.get("/", auth=("ann", "a wrong password!")).status_code == 401  # another user is not held up


def test_failed_logins_from_one_address_are_throttled_whatever_user_they_name(clean, hashes):
    settings = clean.model_copy(update={"gallery_user": "ana", "gallery_password": SecretStr(PASSWORD),
                                        "login_failures_per_user": 100, "login_failures_per_address": 4})  # fmt: skip
    guesser = TestClient(create_app(settings), raise_server_exceptions=False, client=("10.0.0.9", 5000))
    for n in range(4):
        assert guesser.get("/", auth=(f"user{n}", "a wrong password!")).status_code == 401
    checked = len(hashes)
    assert guesser.get("/", auth=("user9", "a wrong password!")).status_code == 429
    assert guesser.get("/", auth=("ana", PASSWORD)).status_code == 429  # the configured login is throttled too
    assert len(hashes) == checked
    elsewhere = TestClient(create_app(settings), raise_server_exceptions=False, client=("10.0.0.10", 5000))
    assert elsewhere.get("/", auth=("ana", PASSWORD)).status_code == 200


@pytest.mark.parametrize("trusted", ["127.0.0.1", "10.9.9.0/24", ""])
def test_behind_a_trusted_proxy_the_throttle_counts_the_client_it_names_and_no_one_else_can_name_one(
    clean, trusted
):
    """The gallery served as `mas serve` serves it, on loopback TCP: with loopback a trusted proxy, failed
    logins are counted by the address X-Forwarded-For names, so one guessing client does not lock out the
    others behind the proxy; when loopback is not trusted (another network, or none), the header is ignored
    and every request counts against the connecting address."""
    settings = clean.changed(
        gallery_user="ana", gallery_password=PASSWORD, login_failures_per_user=100, login_failures_per_address=3,
        trusted_proxies=trusted,
    )  # fmt: skip
    guesser, other = {"X-Forwarded-For": "203.0.113.7"}, {"X-Forwarded-For": "198.51.100.4"}
    with served_gallery(settings) as gallery, httpx.Client(base_url=gallery.url, timeout=30) as http:
        for n in range(3):
            assert http.get("/", auth=(f"user{n}", "a wrong password!"), headers=guesser).status_code == 401
        assert http.get("/", auth=("ana", PASSWORD), headers=guesser).status_code == 429
        answer = http.get("/", auth=("ana", PASSWORD), headers=other).status_code
    assert answer == (200 if trusted == "127.0.0.1" else 429)


def test_a_trusted_proxy_that_is_no_address_is_refused_naming_the_variable(clean):
    with pytest.raises(ValueError, match="not an address or a network"):
        clean.changed(trusted_proxies="127.0.0.1,proxy.example")


# --- framing and the other headers ------------------------------------------------------------------

SAFE = {"x-frame-options": "DENY", "x-content-type-options": "nosniff", "referrer-policy": "same-origin"}


def test_every_response_carries_the_framing_headers_and_pages_a_policy_they_satisfy(clean):
    settings = clean.model_copy(update={"api_token": SecretStr("tok-123")})
    http = TestClient(create_app(settings), raise_server_exceptions=False)
    token = {"Authorization": "Bearer tok-123"}
    replies = {
        "page": http.get("/", headers=token),
        "memory page": http.get("/memory", headers=token),
        "error page": http.get(f"/batches/{MISSING}", headers=token),
        "api": http.get("/api/v1/batches", headers=token),
        "api problem": http.get(f"/api/v1/batches/{MISSING}", headers=token),
        "refused": http.get("/"),
        "probe": http.get("/healthz"),
    }
    assert [replies[what].status_code for what in ("page", "memory page", "error page", "refused")] == [
        200,
        200,
        404,
        401,
    ]
    for what, reply in replies.items():
        for header, value in SAFE.items():
            assert reply.headers[header] == value, (what, header)
        policy = reply.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in policy and "default-src 'none'" in policy, (what, policy)
        if reply.headers["content-type"].startswith("text/html"):  # what the page runs is what the policy allows
            page = reply.text
            for tag in ("script", "style"):
                inline = re.findall(rf"<{tag}\b[^>]*>(.*?)</{tag}>", page, flags=re.DOTALL)
                allowed = re.search(rf"{tag}-src ([^;]*)", policy).group(1).split()
                assert len(inline) == 1 and allowed == [f"'sha256-{_sha256(inline[0])}'"], (what, tag)
            assert not re.search(r"\sstyle=|\son\w+=", page), what  # no inline style or handler the policy forbids
    docs = http.get("/api/v1/docs", headers=token)
    assert docs.status_code == 200 and docs.headers["content-security-policy"] == "frame-ancestors 'none'"
    assert docs.headers["x-frame-options"] == "DENY"


def _sha256(text: str) -> str:
    return base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()
