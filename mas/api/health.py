"""Probes for compose, a load balancer or a supervisor: `/healthz` (this process answers) and `/readyz` (the
studio can take work: PostgreSQL, Redis, a worker on each queue, the video backend and the agent endpoint
answer, and the queues are not full), naming the check that fails. Neither needs credentials: they tell
whether, not what."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import sqlalchemy as sa
from starlette.requests import Request
from starlette.responses import JSONResponse

from mas import names
from mas.config import Settings

TIMEOUT_S = 3.0


def healthz(request: Request) -> JSONResponse:  # noqa: ARG001
    return JSONResponse({"status": "ok"})


def readyz(request: Request) -> JSONResponse:
    """200 when every check passes, else 503; each check's answer either way."""
    settings: Settings = request.app.state.settings
    results = {name: _run(check, settings) for name, check in CHECKS.items()}
    ready = all(result == "ok" for result in results.values())
    return JSONResponse({"ready": ready, "checks": results}, status_code=200 if ready else 503)


def _run(check: Callable[[Settings], str | None], settings: Settings) -> str:
    try:
        return check(settings) or "ok"
    except Exception as exc:  # a probe says what failed; it never fails itself
        from mas.redaction import redact_text

        return redact_text(f"{type(exc).__name__}: {exc}", settings.secret_values()).splitlines()[0][:300]


def _postgres(settings: Settings) -> str | None:
    from mas import db

    with db.engine(settings, start=False).connect() as conn:
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


CHECKS: dict[str, Callable[[Settings], str | None]] = {
    "postgres": _postgres,
    "redis": _redis,
    "workers": _workers,
    "queues": _waiting,
    "video_backend": _video_backend,
    "agent_endpoint": _agents,
}
