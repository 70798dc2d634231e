"""/readyz's answer without servers: the checks run once per window and by one request at a time, and a
failure is named in words, never with an exception's text."""

from __future__ import annotations

import threading

import httpx

from mas.api.health import OK, Readiness, _failure
from mas.config import Settings


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_checks_run_once_per_window(tmp_path):
    calls: list[str] = []
    clock = Clock()
    readiness = Readiness(
        Settings(data_dir=tmp_path, ready_cache_seconds=5), {"db": lambda _: calls.append("db")}, clock
    )
    assert readiness.answer() == {"db": OK} and calls == ["db"]
    clock.now = 4.9
    assert readiness.answer() == {"db": OK} and calls == ["db"]  # within the window: the last answer
    clock.now = 5.0
    assert readiness.answer() == {"db": OK} and calls == ["db", "db"]


def test_one_request_refreshes_while_the_others_get_the_last_answer_or_wait_for_the_first(tmp_path):
    release, started = threading.Event(), threading.Event()
    calls: list[int] = []

    def slow(settings: Settings) -> str | None:  # noqa: ARG001
        calls.append(1)
        started.set()
        assert release.wait(30)
        return None if len(calls) == 1 else "not the first answer"

    clock = Clock()
    readiness = Readiness(Settings(data_dir=tmp_path, ready_cache_seconds=5), {"slow": slow}, clock)
    answers: list[dict[str, str]] = []
    first = [threading.Thread(target=lambda: answers.append(readiness.answer())) for _ in range(6)]
    for thread in first:
        thread.start()
    assert started.wait(30)
    release.set()
    for thread in first:
        thread.join(30)
    assert len(calls) == 1 and answers == [{"slow": OK}] * 6  # none yet: the others waited for the one run

    release.clear()
    started.clear()
    clock.now = 10.0  # stale: the next request refreshes, the others meanwhile get the last answer at once
    refresher = threading.Thread(target=readiness.answer)
    refresher.start()
    assert started.wait(30)
    assert [readiness.answer() for _ in range(5)] == [{"slow": OK}] * 5 and len(calls) == 2
    release.set()
    refresher.join(30)
    assert readiness.answer() == {"slow": "not the first answer"} and len(calls) == 2


def test_a_failure_is_named_without_the_exception():
    request = httpx.Request("GET", "http://127.0.0.1:9/v1/models")
    assert _failure(httpx.ConnectError("[Errno 111] Connection refused", request=request)) == "not reachable"
    assert _failure(ConnectionRefusedError(111, "Connection refused")) == "not reachable"
    answered = httpx.HTTPStatusError("500", request=request, response=httpx.Response(500, request=request))
    assert _failure(answered) == "answered 500"
    assert _failure(httpx.ReadTimeout("timed out", request=request)) == "did not answer in time"
    assert _failure(KeyError("secret detail")) == "failed (the server's log says why)"


def test_a_failing_check_logs_its_exception_redacted_and_answers_in_words(tmp_path, caplog):
    def broken(settings: Settings) -> str | None:  # noqa: ARG001
        raise httpx.ConnectError("cannot reach http://ana:hunter2@llm.example/v1 ([Errno 111])")

    readiness = Readiness(Settings(data_dir=tmp_path), {"agent_endpoint": broken})
    with caplog.at_level("WARNING", logger="mas.api.health"):
        assert readiness.answer() == {"agent_endpoint": "not reachable"}
    assert "ConnectError" in caplog.text and "Errno 111" in caplog.text and "hunter2" not in caplog.text


def test_readyz_names_the_server_that_leads_where_there_are_several(tmp_path):
    """A primary and its standbys, or Sentinel-watched Redis: /readyz says which one leads now; a service of one
    server, or one whose leader cannot be asked, is not named."""
    from starlette.applications import Starlette
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from mas.api.health import readyz

    def unknown(settings: Settings) -> str | None:  # noqa: ARG001
        raise ConnectionRefusedError(111, "Connection refused")

    app = Starlette(routes=[Route("/readyz", readyz)])
    app.state.readiness = Readiness(
        Settings(data_dir=tmp_path),
        {"postgres": lambda _: None},
        primaries={"postgres": lambda _: "db-b.example:5432", "redis": lambda _: None, "other": unknown},
    )
    body = TestClient(app).get("/readyz").json()
    assert body == {"ready": True, "checks": {"postgres": OK}, "primaries": {"postgres": "db-b.example:5432"}}
    app.state.readiness = Readiness(Settings(data_dir=tmp_path), {"postgres": lambda _: None})
    assert "primaries" not in TestClient(app).get("/readyz").json()  # checks of its own: nothing to locate
