"""The gallery's routes, its gate (host check and basic auth) and the server that runs it.

Pages are rendered on the server from Postgres on every request, so they are never stale; the only
script is a few lines in `base.html` that poll the JSON API (`mas.api`, mounted at /api/v1) for live
progress and send the buttons' actions to it. Endpoints are plain functions: Starlette runs them in its
thread pool, where the synchronous SQLAlchemy sessions belong.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

import sqlalchemy as sa
import uvicorn
from sqlalchemy.orm import Session, selectinload
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    JSONResponse,
    PlainTextResponse,
    Response,
)
from starlette.routing import Mount, Route
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Receive, Scope, Send

from mas.api import create_api
from mas.api.health import Readiness, healthz, readyz
from mas.config import Settings, is_loopback
from mas.db import DatabaseUnavailable, session_scope
from mas.domain.states import TERMINAL
from mas.errors import InvalidInput, InvalidSettings
from mas.gallery import convertors  # noqa: F401  (registers the {name:id} URL convertor)
from mas.gallery.control import batch_action, pick_winner
from mas.gallery.frames import strip_jpeg
from mas.learning.promotion import expectation_text
from mas.memory import blocks
from mas.models import ABTest, ABVariation, Attempt, Batch, Series, Video
from mas.reports import queries
from mas.reports.metrics import metrics
from mas.reports.queries import Outcomes
from mas.runtime.services import ServiceError
from mas.storage import storage
from mas.video import VideoUnreadable

FINAL = tuple(TERMINAL)
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
MAX_ID = 2**31 - 1  # Postgres integer: a larger id in a URL is simply not found, never a server error
LIST_LIMIT = 100

templates = Jinja2Templates(directory=Path(__file__).parent / "templates")
templates.env.filters["pretty"] = lambda value: json.dumps(value, indent=2, ensure_ascii=False)
Row = TypeVar("Row")


class GalleryError(InvalidSettings, ValueError):
    """The gallery can't start as configured; the message says what to set."""


# --- serving --------------------------------------------------------------------------------------


def credentials(settings: Settings) -> tuple[str, str] | None:
    """(user, password) when basic auth is configured, None when not; half a pair is an error."""
    user = settings.service.gallery_user or ""
    password = settings.service.gallery_password.get_secret_value() if settings.service.gallery_password else ""
    if bool(user) != bool(password):
        raise GalleryError("set both MAS_GALLERY_USER and MAS_GALLERY_PASSWORD, or neither")
    return (user, password) if user else None


def server(settings: Settings, *, host: str = "127.0.0.1", port: int = 8000) -> uvicorn.Server:
    """The gallery's HTTP server, checked before it binds anything.

    Beyond loopback anyone on the network could pick winners and read memory, so it requires
    credentials there. On loopback it accepts only loopback Host headers, which stops a web page from
    reaching it through DNS rebinding.
    """
    loopback = is_loopback(host)
    if not loopback and credentials(settings) is None and settings.service.api_token is None:
        raise GalleryError(
            f"refusing to serve the gallery on {host} without credentials: set MAS_GALLERY_USER and "
            "MAS_GALLERY_PASSWORD (or MAS_API_TOKEN), or serve on 127.0.0.1"
        )
    app = create_app(settings, allowed_hosts=LOOPBACK_HOSTS | {host} if loopback else None)
    return uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="info"))


def serve(settings: Settings, *, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Run the gallery until interrupted (what `mas serve` does)."""
    server(settings, host=host, port=port).run()


OPEN_PATHS = frozenset({"/healthz", "/readyz"})
"""Probes answer without credentials (they tell whether the studio works, not what it holds)."""


class _Gate:
    """Refuses a request before any route runs: a Host header not allowed, or missing/wrong credentials
    (basic auth with the gallery's user and password, or the API's bearer token, whichever are set)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        login: tuple[str, str] | None,
        token: str | None,
        hosts: frozenset[str] | None,
    ) -> None:
        self.app = app
        self.login = None if login is None else (login[0].encode(), login[1].encode())
        self.token = None if token is None else token.encode()
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = (
            self._refusal(Headers(scope=scope), scope.get("path", ""), scope.get("method", "GET"))
            if scope["type"] == "http"
            else None
        )
        if refusal is None:
            await self.app(scope, receive, send)
        else:
            await refusal(scope, receive, send)

    def _refusal(self, headers: Headers, path: str, method: str) -> Response | None:
        if self.hosts is not None and _hostname(headers.get("host", "")) not in self.hosts:
            return PlainTextResponse("this gallery only answers to its loopback host names", status_code=400)
        if method != "GET" and path.startswith("/api/") and _cross_site(headers):
            return JSONResponse(
                {"type": "urn:mas:problem:cross-site", "title": "Forbidden", "status": 403, "retryable": False,
                 "detail": "a request sent from another site's page was refused; nothing changed"},
                status_code=403, media_type="application/problem+json",
            )  # fmt: skip
        if (self.login is None and self.token is None) or path in OPEN_PATHS:
            return None
        authorization = headers.get("authorization", "")
        if self.login is not None and _basic_auth_ok(authorization, self.login):
            return None
        if self.token is not None and _bearer_ok(authorization, self.token):
            return None
        if path.startswith("/api/"):
            return JSONResponse(
                {"type": "urn:mas:problem:unauthorized", "title": "Unauthorized", "status": 401,
                 "detail": "the studio needs its credentials (basic auth or a bearer token)", "retryable": False},
                status_code=401, media_type="application/problem+json",
                headers={"WWW-Authenticate": 'Bearer realm="mas", Basic realm="mas gallery", charset="UTF-8"'},
            )  # fmt: skip
        return PlainTextResponse(
            "the gallery needs its user and password",
            status_code=401,
            headers={"WWW-Authenticate": 'Basic realm="mas gallery", charset="UTF-8"'},
        )


def _hostname(host_header: str) -> str | None:
    try:
        return urlsplit("//" + host_header).hostname
    except ValueError:  # e.g. an unclosed IPv6 bracket
        return None


def _cross_site(headers: Headers) -> bool:
    """A page on another site made the browser send this (CSRF): browsers send Origin on such a request."""
    origin = headers.get("origin")
    return origin is not None and urlsplit(origin).netloc != headers.get("host")


def _bearer_ok(header: str, token: bytes) -> bool:
    scheme, _, given = header.partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(given.strip().encode(), token)


def _basic_auth_ok(header: str, login: tuple[bytes, bytes]) -> bool:
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        user, sep, password = base64.b64decode(encoded.strip(), validate=True).partition(b":")
    except binascii.Error:
        return False
    # both compared every time, in constant time, so timing tells nothing about either
    user_ok = secrets.compare_digest(user, login[0])
    password_ok = secrets.compare_digest(password, login[1])
    return bool(sep) and user_ok and password_ok


MAX_PATH_CHARS = 1024
"""The longest file path the gallery looks up (a longer one cannot name a video the studio wrote)."""


def create_app(settings: Settings, *, allowed_hosts: frozenset[str] | None = None) -> Starlette:
    """The gallery as an ASGI app; basic auth is enforced whenever credentials are set, and then the
    signed-in user is whose taste the gallery shows and whose picks it records."""
    login = credentials(settings)
    if login is not None:
        try:
            settings = settings.for_user(login[0])
        except InvalidInput as exc:
            raise GalleryError(f"MAS_GALLERY_USER is also the studio user: {exc}") from None
    app = Starlette(
        routes=[
            Route("/", index),
            Route("/batches/{batch_id:id}", batch_page),
            Route("/series/{series_id:id}", series_page),
            Route("/ab/{test_id:id}", ab_page),
            Route("/ab/{test_id:id}/pick/{label}", pick_winner, methods=["POST"]),
            Route("/batches/{batch_id:id}/{action}", batch_action, methods=["POST"]),
            Route("/memory", memory_page),
            Route("/videos/{video_id:id}/frames.jpg", frames),
            Route("/files/{path:path}", video_file),
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics),
            Mount("/api/v1", app=create_api(settings)),
        ],
        middleware=[
            Middleware(
                _Gate,
                login=login,
                token=settings.service.api_token.get_secret_value() if settings.service.api_token else None,
                hosts=allowed_hosts,
            )
        ],
        exception_handlers={HTTPException: _error, DatabaseUnavailable: _unavailable, ServiceError: _unavailable},
    )
    app.state.settings = settings
    app.state.readiness = Readiness(settings)  # /readyz's checks, run at most every MAS_READY_CACHE_SECONDS
    return app


# --- views ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VideoView:
    """One video as a card shows it: its latest attempt, and its file only if it may be served."""

    video: Video
    attempt: Attempt | None
    file_url: str | None
    file_note: str


@dataclass(frozen=True)
class Progress:
    """A batch and how its videos ended so far."""

    batch: Batch
    counts: Outcomes

    @property
    def done(self) -> int:
        return self.counts.done

    @property
    def percent(self) -> int:
        return round(100 * self.done / max(self.batch.total, 1))


def _settings(request: Request) -> Settings:
    return request.app.state.settings


def _get(session: Session, model: type[Row], key: int) -> Row | None:
    return session.get(model, key) if key <= MAX_ID else None


def _served_file(settings: Settings, video: Video) -> tuple[str | None, str]:
    """The video's key in the storage when its file may be served, else None and the reason to show instead."""
    if not video.output_path:
        if video.state in TERMINAL:
            return None, f"{video.state.value} before a file was written"
        return None, "rendering…"
    key = storage(settings).key_of(video.output_path)
    if key is None:
        return None, "its file is outside the output folder and is not served"
    if not storage(settings).exists(key):  # a bucket's video is downloaded only when it is played
        return None, f"its file {key.rsplit('/', 1)[-1]} is missing"
    return key, ""


def _video_view(settings: Settings, video: Video) -> VideoView:
    key, note = _served_file(settings, video)
    url = None if key is None else "/files/" + quote(key)
    return VideoView(video, video.attempts[-1] if video.attempts else None, url, note)


def _progress(session: Session, batches: list[Batch]) -> list[Progress]:
    counts = queries.outcomes(session, (b.id for b in batches))
    return [Progress(b, counts.get(b.id, Outcomes())) for b in batches]


def _videos(session: Session, ids: Iterable[int]) -> dict[int, Video]:
    stmt = sa.select(Video).where(Video.id.in_(list(ids))).options(selectinload(Video.attempts))
    return {v.id: v for v in session.scalars(stmt)}


def index(request: Request) -> Response:
    with session_scope(_settings(request)) as session:
        batches = list(session.scalars(sa.select(Batch).order_by(Batch.id.desc()).limit(LIST_LIMIT)))
        series = list(session.scalars(sa.select(Series).order_by(Series.id.desc()).limit(LIST_LIMIT)))
        tests = list(session.scalars(sa.select(ABTest).order_by(ABTest.id.desc()).limit(LIST_LIMIT)))
        progress = _progress(session, batches)
    memory = blocks.read_all(_settings(request))
    return templates.TemplateResponse(
        request,
        "index.html",
        {
            "progress": progress,
            "series": series,
            "tests": tests,
            "style": memory["user_style"],
            "winning": memory["ab_testing"]["WINNING_PATTERNS"],
        },
    )


def batch_page(request: Request) -> Response:
    settings, batch_id = _settings(request), request.path_params["batch_id"]
    with session_scope(settings) as session:
        batch = _get(session, Batch, batch_id)
        if batch is None:
            raise HTTPException(404, f"there is no batch {batch_id}")
        videos = list(
            session.scalars(
                sa.select(Video)
                .where(Video.batch_id == batch_id)
                .order_by(Video.position)
                .options(selectinload(Video.attempts))
            )
        )
        series = _get(session, Series, batch.series_id) if batch.series_id else None
        (progress,) = _progress(session, [batch])
    return templates.TemplateResponse(
        request,
        "batch.html",
        {
            "progress": progress,
            "series": series,
            "cards": [_video_view(settings, v) for v in videos],
        },
    )


def series_page(request: Request) -> Response:
    series_id = request.path_params["series_id"]
    with session_scope(_settings(request)) as session:
        series = _get(session, Series, series_id)
        if series is None:
            raise HTTPException(404, f"there is no series {series_id}")
        batches = list(session.scalars(sa.select(Batch).where(Batch.series_id == series_id).order_by(Batch.id)))
        progress = _progress(session, batches)
    return templates.TemplateResponse(request, "series.html", {"series": series, "progress": progress})


def ab_page(request: Request) -> Response:
    settings, test_id = _settings(request), request.path_params["test_id"]
    with session_scope(settings) as session:
        test = _get(session, ABTest, test_id)
        if test is None:
            raise HTTPException(404, f"there is no A/B test {test_id}")
        variations = list(
            session.scalars(sa.select(ABVariation).where(ABVariation.test_id == test_id).order_by(ABVariation.label))
        )
        videos = _videos(session, (v.video_id for v in variations if v.video_id is not None))
        batch = session.scalars(sa.select(Batch).where(Batch.ab_test_id == test_id)).first()
        progress = _progress(session, [batch])[0] if batch else None
    cards = [(v, _video_view(settings, videos[v.video_id]) if v.video_id in videos else None) for v in variations]
    rendering = any(card is None or card.video.state not in FINAL for _, card in cards)
    expectation = expectation_text(
        expected=test.expected_label,
        probability=test.expected_probability,
        by=test.expected_by,
        winner=test.winner_label,
    )
    return templates.TemplateResponse(
        request,
        "ab.html",
        {
            "test": test,
            "cards": cards,
            "progress": progress,
            "rendering": rendering,
            "expectation": expectation,
        },
    )


def memory_page(request: Request) -> Response:
    memory = blocks.read_all(_settings(request))
    return templates.TemplateResponse(
        request,
        "memory.html",
        {
            "memory": memory,
            "style": memory["user_style"],
            "winning": memory["ab_testing"]["WINNING_PATTERNS"],
        },
    )


def frames(request: Request) -> Response:
    settings, video_id = _settings(request), request.path_params["video_id"]
    with session_scope(settings) as session:
        video = _get(session, Video, video_id)
        if video is None:
            raise HTTPException(404, f"there is no video {video_id}")
        key, note = _served_file(settings, video)
    path = None if key is None else storage(settings).local_file(key)
    if path is None:
        raise HTTPException(404, f"video {video_id} has no frames to show: {note or 'its file is missing'}")
    try:
        return Response(strip_jpeg(path), media_type="image/jpeg")
    except VideoUnreadable as exc:
        raise HTTPException(422, str(exc)) from None


def video_file(request: Request) -> Response:
    """A stored video (a copy from the bucket, where videos are in one), with range requests (seeking);
    nothing outside the storage, links included."""
    settings, raw = _settings(request), request.path_params["path"]
    if len(raw) > MAX_PATH_CHARS or any(len(part) > 255 for part in raw.split("/")):
        raise HTTPException(404, "no such file in the output folder (the path is too long)")
    path = storage(settings).local_file(raw)
    if path is None:
        raise HTTPException(404, f"no file {raw!r} in the output folder")
    return FileResponse(path)


# --- errors ---------------------------------------------------------------------------------------


def _error(request: Request, exc: Exception) -> Response:
    """A clear page (or JSON under /api) saying what was not found or refused."""
    assert isinstance(exc, HTTPException)
    message = f"there is no page {request.url.path}" if exc.detail == "Not Found" else exc.detail  # no route matched
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": message}, status_code=exc.status_code, headers=exc.headers)
    back = f"/ab/{request.path_params['test_id']}" if "test_id" in request.path_params else "/"
    context: dict[str, Any] = {"status": exc.status_code, "message": message, "back": back}
    return templates.TemplateResponse(request, "error.html", context, status_code=exc.status_code, headers=exc.headers)


def _unavailable(request: Request, exc: Exception) -> Response:
    """PostgreSQL can't be reached or started: say so (the message names the URL), instead of a bare 500."""
    return templates.TemplateResponse(
        request, "error.html", {"status": 503, "message": str(exc), "back": "/"}, status_code=503
    )
