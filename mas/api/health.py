"""Probes for compose, a load balancer or a supervisor: `/healthz` (this process answers) and `/readyz` (the
studio can take work: PostgreSQL, Redis, a worker on each queue, the video backend and the agent endpoint
answer, and the queues are not full), naming the check that fails and how (`not reachable`, `answered 500`),
never with an exception's text: that goes to the log, redacted. Neither needs credentials: they tell whether,
not what.

`/readyz` answers from its last checks for MAS_READY_CACHE_SECONDS: a probe polled often (every replica, every
few seconds) does not broadcast to the workers and call ComfyUI and the agent endpoint each time. Each app
holds its own `Readiness` (made by the gallery's `create_app`); one request at a time refreshes it, the others
meanwhile get the last answer, or wait for the first one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import httpx
import redis
import sqlalchemy as sa
from kombu.exceptions import OperationalError as BrokerError
from starlette.requests import Request
from starlette.responses import JSONResponse

from mas import names
from mas.config import Settings
from mas.redaction import redact_text

TIMEOUT_S = 3.0
OK = "ok"
log = logging.getLogger(__name__)

Check = Callable[[Settings], str | None]
"""A check: None when it passes, else what is wrong in words; an exception says the service failed."""

Locate = Callable[[Settings], str | None]
"""Where a service of several servers leads now (`host:port`); None for a service of one server."""


def healthz(request: Request) -> JSONResponse:  # noqa: ARG001
    return JSONResponse({"status": "ok"})


def readyz(request: Request) -> JSONResponse:
    """200 when every check passes, else 503; each check's answer either way, and, for a service of several
    servers (a primary and its standbys, Sentinel-watched Redis), which one leads now."""
    readiness: Readiness = request.app.state.readiness
    answer = readiness.latest()
    ready = all(result == OK for result in answer.checks.values())
    body: dict[str, object] = {"ready": ready, "checks": answer.checks}
    if answer.warnings:
        body["warnings"] = answer.warnings
    if answer.primaries:
        body["primaries"] = answer.primaries
    return JSONResponse(body, status_code=200 if ready else 503)


@dataclass(frozen=True)
class Answer:
    checks: dict[str, str]
    at: float  # the clock when the checks ended
    primaries: dict[str, str] = field(default_factory=dict)  # service -> `host:port` of its leading server now
    warnings: dict[str, str] = field(default_factory=dict)  # what is wrong without making the studio unready


class Readiness:
    """The checks' answer, run at most once per MAS_READY_CACHE_SECONDS and by one request at a time."""

    def __init__(
        self,
        settings: Settings,
        checks: Mapping[str, Check] | None = None,
        clock: Callable[[], float] = time.monotonic,
        primaries: Mapping[str, Locate] | None = None,
        warnings: Mapping[str, Check] | None = None,
    ) -> None:
        self.settings, self.clock = settings, clock
        self.checks = dict(CHECKS if checks is None else checks)
        self.warnings = dict((WARNINGS if checks is None else {}) if warnings is None else warnings)
        self.locators = dict((PRIMARIES if checks is None else {}) if primaries is None else primaries)
        self._refreshing = threading.Lock()
        self._last: Answer | None = None

    def answer(self) -> dict[str, str]:
        return self.latest().checks

    def latest(self) -> Answer:
        last = self._last
        if last is not None and self._fresh(last):
            return last
        if not self._refreshing.acquire(blocking=last is None):  # with none yet, wait for the first
            assert last is not None
            return last  # another request is refreshing: the last answer meanwhile
        try:
            last = self._last
            if last is None or not self._fresh(last):
                checks = {name: self._run(name, check) for name, check in self.checks.items()}
                primaries = {name: where for name, locate in self.locators.items() if (where := self._locate(locate))}
                warned = {name: self._run(name, check) for name, check in self.warnings.items()}
                warnings = {name: result for name, result in warned.items() if result != OK}
                last = self._last = Answer(checks, self.clock(), primaries, warnings)
            return last
        finally:
            self._refreshing.release()

    def _locate(self, locate: Locate) -> str | None:
        try:
            return locate(self.settings)
        except Exception as exc:  # the service's check says it is away; where it leads is then unknown
            log.info("readyz: cannot tell which server leads: %s", redact_text(str(exc), self.settings.secret_values()))
            return None

    def _fresh(self, answer: Answer) -> bool:
        return self.clock() - answer.at < self.settings.service.ready_cache_seconds

    def _run(self, name: str, check: Check) -> str:
        try:
            return check(self.settings) or OK
        except Exception as exc:  # a probe says what failed; it never fails itself
            failure = _failure(exc)
            detail = redact_text(f"{type(exc).__name__}: {exc}", self.settings.secret_values())
            log.warning("readyz: %s %s: %s", name, failure, detail)
            return failure


def _failure(exc: Exception) -> str:
    """What failed, in words that name no exception (the log has it)."""
    from mas.errors import PeerUnavailable
    from mas.runtime.services import ServiceError

    if isinstance(exc, httpx.HTTPStatusError):
        return f"answered {exc.response.status_code}"
    if isinstance(exc, httpx.TimeoutException | redis.TimeoutError | TimeoutError):
        return "did not answer in time"
    unreachable = (OSError, httpx.TransportError, sa.exc.OperationalError, sa.exc.InterfaceError, redis.ConnectionError)
    if isinstance(exc, (*unreachable, BrokerError, ServiceError, PeerUnavailable)):
        return "not reachable"
    return "failed (the server's log says why)"


def _postgres(settings: Settings) -> str | None:
    from mas import db

    with db.ready_engine(settings).connect() as conn:
        conn.execute(sa.text("select 1"))
    return None


def _redis(settings: Settings) -> str | None:
    from mas.runtime.clients import redis_client

    redis_client(settings).ping()
    return None


def _workers(settings: Settings) -> str | None:
    from mas.runtime.app import app_for

    answers = app_for(settings).control.inspect(timeout=1.0).active_queues() or {}
    consumed = {queue["name"] for queues in answers.values() for queue in queues}
    missing = [kind for kind, queues in names.WORKER_QUEUES.items() if not consumed & set(queues)]
    return f"no {' and no '.join(missing)} worker answers" if missing else None


def _waiting(settings: Settings) -> str | None:
    from mas.runtime.app import app_for, queue_keys
    from mas.runtime.clients import redis_client

    app, client = app_for(settings), redis_client(settings)
    waiting = sum(client.llen(key) for queue in app.conf.task_queues for key in queue_keys(app, queue.name))
    if waiting > settings.service.ready_max_waiting:
        return f"{waiting} tasks wait, more than MAS_READY_MAX_WAITING ({settings.service.ready_max_waiting}): the studio is full"
    return None


def _video_backend(settings: Settings) -> str | None:
    if settings.video.backend != "comfyui":
        return None  # the preview and in-process backends live in the gpu worker, which `workers` asks
    httpx.get(f"{settings.comfyui.url.rstrip('/')}/system_stats", timeout=TIMEOUT_S).raise_for_status()
    return None


def _agents(settings: Settings) -> str | None:
    if settings.agents.backend == "llm":
        key = settings.llm.api_key.get_secret_value() if settings.llm.api_key else None
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        httpx.get(f"{settings.llm.url.rstrip('/')}/models", headers=headers, timeout=TIMEOUT_S).raise_for_status()
    elif settings.agents.backend == "letta":
        httpx.get(f"{settings.letta.url.rstrip('/')}/v1/health/", timeout=TIMEOUT_S).raise_for_status()
    return None


def _agent_replies(settings: Settings) -> str | None:
    """A model that answers but whose replies never validate: the studio still takes work (its own rules write
    the prompts), so this is reported, not a reason to be taken out of a load balancer."""
    from mas.reports.queries import model_unusable_lately

    return model_unusable_lately(settings)


def _database_primary(settings: Settings) -> str | None:
    from mas import db

    return db.primary(settings)


def _redis_master(settings: Settings) -> str | None:
    from mas.runtime.clients import redis_master

    return redis_master(settings)


PRIMARIES: dict[str, Locate] = {"postgres": _database_primary, "redis": _redis_master}
"""Which server leads, for the services that name several (their addresses are the operator's own settings)."""

WARNINGS: dict[str, Check] = {"agent_replies": _agent_replies}
"""Checks that are reported under `warnings` and leave the answer ready."""

CHECKS: dict[str, Check] = {
    "postgres": _postgres,
    "redis": _redis,
    "workers": _workers,
    "queues": _waiting,
    "video_backend": _video_backend,
    "agent_endpoint": _agents,
}
