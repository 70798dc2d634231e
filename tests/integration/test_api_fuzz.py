"""Every route of the JSON API fuzzed from the OpenAPI document it serves, against real PostgreSQL and Redis:
schemathesis gives each path, query, header and body field values of its type and values out of its range or of
the wrong type, and every integer of every path and query is given the values at and past the database's bounds.
Whatever a client sends, the answer is never a server error, and every refusal is a problem."""

from __future__ import annotations

import re

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from starlette.routing import Mount
from starlette.testclient import TestClient

from mas.gallery import create_app

EXAMPLES = 25
"""Examples per operation and generation mode: the whole run stays well under two minutes on a loaded machine."""
STREAMS = ("/events", "/batches/{batch_id}/events")
"""The event streams never end by themselves: their one slot is taken, so a valid request is answered 503 (this
server's streams are all open, retryable) and an invalid one 4xx, instead of a stream the client would read for
ever."""
BOUNDS = (-(2**63) - 1, -(2**31) - 1, -(2**31), -1, 0, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 10**30)
"""Integers at and past PostgreSQL's integer and bigint, and far past both."""


@pytest.fixture
def app(clean):
    app = create_app(clean.changed(stream_max=1))
    api = next(route.app for route in app.routes if isinstance(route, Mount) and route.path == "/api/v1")
    assert api.state.streams.take()  # the one slot: every stream a request opens is refused (see STREAMS)
    return app


@pytest.fixture
def api_schema(app):
    schema = schemathesis.openapi.from_asgi("/api/v1/openapi.json", app)
    schema.config.generation.update(
        modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
        max_examples=EXAMPLES,
        deterministic=True,
        database="none",  # nothing kept between runs: each run is the same
    )
    return schema


def answered_well(path: str, status: int, content_type: str, body: str) -> None:
    """No server error (but a full server's stream, said as a retryable problem), and a refusal is a problem."""
    if path in STREAMS and status == 503:
        assert '"retryable":true' in body, body
        return
    assert status < 500, body
    if status >= 400:
        assert content_type == "application/problem+json", body


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None
)
def test_no_input_is_a_server_error(case):
    response = case.call()
    said = f"{case.method} {case.formatted_path} {case.query} {case.headers} {case.body!r}: {response.content[:500]!r}"
    answered_well(case.operation.path, response.status_code, response.headers["content-type"][0], said)


def test_every_integer_at_and_past_the_database_bounds_is_a_4xx(app):
    """The ids in paths (batches, videos, A/B tests, events) and the integers in queries, each alone at every
    bound, the other fields valid: a row out of an id's range is not found, a number out of a query's range
    refused."""
    http = TestClient(app, raise_server_exceptions=False)
    document = http.get("/api/v1/openapi.json").json()
    valid = {"action": "cancel", "label": "user_style"}
    bodies = {"/ab/{test_id}/pick": {"label": "A"}, "/batches": {"theme": "owls", "count": 1}}
    tried = 0
    for path, item in document["paths"].items():
        for verb, operation in item.items():
            integers = [p for p in operation.get("parameters", []) if _is_integer(p["schema"])]
            for parameter in integers:
                for value in BOUNDS:
                    given = {**valid, **{p["name"]: 1 for p in integers}, parameter["name"]: value}
                    url = "/api/v1" + re.sub(r"\{(\w+)\}", lambda m, given=given: str(given[m.group(1)]), path)
                    params = {p["name"]: given[p["name"]] for p in integers if p["in"] == "query"}
                    reply = http.request(verb.upper(), url, params=params, json=bodies.get(path))
                    said = f"{verb} {url} {params}: {reply.text}"
                    answered_well(path, reply.status_code, reply.headers["content-type"], said)
                    if parameter["in"] == "path" and not 0 < value < 2**31:
                        assert reply.status_code == 404, reply.text  # no such row: never asked of the database
                    tried += 1
    assert tried >= 8 * len(BOUNDS)  # batches, cancel, videos, file, A/B, pick, events: ids; limit, after: queries


def _is_integer(schema: dict) -> bool:
    return schema.get("type") == "integer" or any(s.get("type") == "integer" for s in schema.get("anyOf", []))
