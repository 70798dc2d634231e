"""Errors as problem details (RFC 9457, `application/problem+json`) carrying the studio's distinction: a
retryable error (a server away, a busy key) is a 503 or 409 with `retryable: true`, a full quota a 429 with
`Retry-After`; a permanent one says what to change. Bad input is always a 4xx and changes nothing; nothing the
studio raises on purpose is a 500."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse

from mas.domain.identity import ActsForOthers
from mas.errors import InvalidInput, InvalidSettings, PeerUnavailable, RetryableError, StudioError, Unauthorized
from mas.pipeline.quotas import QuotaExceeded
from mas.runtime.failover import away_message

MEDIA_TYPE = "application/problem+json"
TITLES = {400: "Bad request", 401: "Unauthorized", 403: "Forbidden", 404: "Not found", 405: "Method not allowed", 409: "Conflict",
          422: "Invalid request", 429: "Too many requests", 503: "Unavailable"}  # fmt: skip


class NotFound(StudioError):
    """No such batch, video, A/B test or block."""


class Conflict(StudioError):
    """The request is well formed but the thing is in no state for it (a closed test, a finished batch)."""


def problem(
    status: int, detail: str, *, kind: str, retryable: bool = False, retry_after: int | None = None, **extra: Any
) -> JSONResponse:
    """The problem's response; `retry_after` (seconds) goes in the body and the `Retry-After` header (a
    retryable 503 says 5 s in the header when it knows no better)."""
    body = {
        "type": f"urn:mas:problem:{kind}",
        "title": TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
        "retryable": retryable,
        **{k: v for k, v in {**extra, "retry_after": retry_after}.items() if v is not None},
    }
    if retry_after is None and retryable and status == 503:
        retry_after = 5
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return JSONResponse(body, status_code=status, media_type=MEDIA_TYPE, headers=headers)


def status_of(exc: StudioError) -> tuple[int, str]:
    """The HTTP status and problem kind of a studio error."""
    if isinstance(exc, NotFound):
        return 404, "not-found"
    if isinstance(exc, Unauthorized):
        return 401, "unauthorized"
    if isinstance(exc, ActsForOthers):
        return 403, "forbidden"
    if isinstance(exc, Conflict):
        return 409, "conflict"
    if isinstance(exc, QuotaExceeded):
        return 429, "quota"
    if isinstance(exc, PeerUnavailable):
        return 503, "unavailable"
    if isinstance(exc, RetryableError):
        return 409, "busy"
    if isinstance(exc, InvalidInput):
        return 422, "invalid-input"
    if isinstance(exc, InvalidSettings):
        return 409, "not-configured"
    return 409, "refused"


def install(app: FastAPI) -> None:
    """Every error of the API answers as a problem."""

    async def studio_error(request: Request, exc: Exception) -> JSONResponse:  # noqa: ARG001
        assert isinstance(exc, StudioError)
        status, kind = status_of(exc)
        retry_after = exc.retry_after if isinstance(exc, QuotaExceeded) else None
        return problem(status, str(exc), kind=kind, retryable=exc.retryable, retry_after=retry_after)

    async def invalid_body(request: Request, exc: Exception) -> JSONResponse:  # noqa: ARG001
        assert isinstance(exc, RequestValidationError)
        errors = [
            {"where": ".".join(str(part) for part in error.get("loc", ())), "message": error.get("msg", "")}
            for error in exc.errors()
        ]
        detail = "; ".join(f"{e['where']}: {e['message']}" for e in errors) or "the request is not valid"
        return problem(422, detail, kind="invalid-request", errors=errors)

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        detail = f"there is nothing at {request.url.path}" if exc.detail == "Not Found" else str(exc.detail)
        return problem(exc.status_code, detail, kind="http")

    async def database_away(request: Request, exc: Exception) -> JSONResponse:
        """PostgreSQL restarting or failing over: a retryable 503, never a 500."""
        settings = request.app.state.settings
        return problem(503, away_message(settings.database.url, exc), kind="unavailable", retryable=True)

    app.add_exception_handler(StudioError, studio_error)
    app.add_exception_handler(sa.exc.OperationalError, database_away)
    app.add_exception_handler(sa.exc.InterfaceError, database_away)
    app.add_exception_handler(RequestValidationError, invalid_body)
    app.add_exception_handler(HTTPException, http_error)
