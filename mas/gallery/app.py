"""The gallery's routes, its gate (host check and basic auth) and the server that runs it.

Pages are rendered on the server from Postgres on every request, so they are never stale; the only
script is a few lines in `base.html` that follow the JSON API's event stream (`mas.api.stream`, from the event a
page was rendered at) for live progress and send the buttons' actions to the API (`mas.api`, at /api/v1). Endpoints are plain functions: Starlette runs them in its
thread pool, where the synchronous SQLAlchemy sessions belong.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import sqlalchemy as sa
import uvicorn
from sqlalchemy.orm import Session, selectinload
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route
from starlette.templating import Jinja2Templates

from mas.accounts import users
from mas.accounts.gate import GalleryError, Gate, configured_login
from mas.accounts.visibility import visible, visible_blocks
from mas.api import create_api
from mas.api.callers import actor_of, identity_of, settings_of
from mas.api.health import Readiness, healthz, readyz
from mas.api.problems import problem
from mas.config import Settings, is_loopback
from mas.db import DatabaseUnavailable, is_row_id, session_scope
from mas.domain.identity import STUDIO, Actor
from mas.domain.states import TERMINAL
from mas.errors import InvalidInput
from mas.gallery import convertors  # noqa: F401  (registers the {name:id} URL convertor)
from mas.gallery.control import batch_action, pick_winner, style_action
from mas.gallery.frames import strip_jpeg
from mas.gallery.headers import SecurityHeaders, page_policy
from mas.learning.promotion import expectation_text
from mas.memory import blocks
from mas.models import ABTest, ABVariation, Attempt, Batch, Series, Video
from mas.outbox import eventlog
from mas.reports import queries
from mas.reports.metrics import metrics
from mas.reports.queries import Outcomes
from mas.runtime.failover import away_message
from mas.runtime.services import ServiceError
from mas.storage import storage
from mas.video import VideoUnreadable

FINAL = tuple(TERMINAL)
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
LIST_LIMIT = 100

templates = Jinja2Templates(directory=Path(__file__).parent / "templates")
templates.env.filters["pretty"] = lambda value: json.dumps(value, indent=2, ensure_ascii=False)
Owned = TypeVar("Owned", Batch, Series, ABTest)


# --- serving --------------------------------------------------------------------------------------


SHUTDOWN_GRACE_S = 5
"""A stopping server finishes its requests for this long, then ends what is left: the event streams, which never
end by themselves (their clients reconnect and resume by Last-Event-ID)."""


def server(
    settings: Settings, *, host: str = "127.0.0.1", port: int = 8000, operator: Actor = STUDIO
) -> uvicorn.Server:
    """The gallery's HTTP server, checked before it binds anything.

    Beyond loopback anyone on the network could pick winners and read memory, so it requires
    credentials there. On loopback it accepts only loopback Host headers, which stops a web page from
    reaching it through DNS rebinding.
    """
    loopback = is_loopback(host)
    guarded = configured_login(settings) is not None or settings.service.api_token is not None
    if not loopback and not guarded and not users.any_users(settings):
        raise GalleryError(
            f"refusing to serve the gallery on {host} without credentials: add users (`mas users add`), or set "
            "MAS_GALLERY_USER and MAS_GALLERY_PASSWORD (or MAS_API_TOKEN), or serve on 127.0.0.1"
        )
    app = create_app(settings, allowed_hosts=LOOPBACK_HOSTS | {host} if loopback else None, operator=operator)
    proxies = settings.service.trusted_proxies
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="info",
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        proxy_headers=bool(proxies),
        forwarded_allow_ips=list(proxies) or None,
    )
    return uvicorn.Server(config)


def serve(settings: Settings, *, host: str = "127.0.0.1", port: int = 8000, operator: Actor = STUDIO) -> None:
    """Run the gallery until interrupted (what `mas serve` does)."""
    server(settings, host=host, port=port, operator=operator).run()


MAX_PATH_CHARS = 1024
"""The longest file path the gallery looks up (a longer one cannot name a video the studio wrote)."""


def create_app(
    settings: Settings, *, allowed_hosts: frozenset[str] | None = None, operator: Actor = STUDIO
) -> Starlette:
    """The gallery as an ASGI app behind its gate: whoever the credential proves is whose work the pages show
    (everyone's for an admin), whose taste they show and whose picks they record. `operator` is who the
    operator's token (and an open studio) acts as."""
    login = configured_login(settings)
    if login is not None:
        try:
            Actor(login[0])
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
            Route("/memory/style/{item_id:id}/{action}", style_action, methods=["POST"]),
            Route("/videos/{video_id:id}/frames.jpg", frames),
            Route("/files/{path:path}", video_file),
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", studio_metrics),
            Mount("/api/v1", app=create_api(settings)),
        ],
        middleware=[
            Middleware(SecurityHeaders, policy=page_policy(templates.get_template("base.html").render())),
            Middleware(Gate, settings=settings, hosts=allowed_hosts, operator=operator),
        ],
        exception_handlers={
            HTTPException: _error,
            DatabaseUnavailable: _unavailable,
            ServiceError: _unavailable,
            sa.exc.OperationalError: _unavailable,
            sa.exc.InterfaceError: _unavailable,
        },
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


def _get(request: Request, session: Session, model: type[Owned], key: int) -> Owned | None:
    """The row, or None when there is none or the caller may not see it (`visible`)."""
    if not is_row_id(key):
        return None
    return session.scalars(
        sa.select(model).where(model.id == key, visible(identity_of(request), model.user_name))
    ).first()


def _listed(request: Request, model: type[Owned]) -> sa.Select[Owned]:
    """The newest rows of `model` the caller may see (`visible`)."""
    stmt = sa.select(model).where(visible(identity_of(request), model.user_name))
    return stmt.order_by(model.id.desc()).limit(LIST_LIMIT)


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
    with session_scope(settings_of(request)) as session:
        after = eventlog.newest(session)  # read first: an event after it may be shown already, none is missed
        batches = list(session.scalars(_listed(request, Batch)))
        series = list(session.scalars(_listed(request, Series)))
        tests = list(session.scalars(_listed(request, ABTest)))
        progress = _progress(session, batches)
    memory = blocks.read_all(settings_of(request), actor_of(request))
    return templates.TemplateResponse(
        request,
        "index.html",
        {
            "stream": f"/api/v1/events?after={after}",
            "progress": progress,
            "series": series,
            "tests": tests,
            "style": memory["user_style"],
            "winning": memory["ab_testing"]["WINNING_PATTERNS"],
        },
    )


def batch_page(request: Request) -> Response:
    settings, batch_id = settings_of(request), request.path_params["batch_id"]
    with session_scope(settings) as session:
        after = eventlog.newest(session)
        batch = _get(request, session, Batch, batch_id)
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
        series = _get(request, session, Series, batch.series_id) if batch.series_id else None
        (progress,) = _progress(session, [batch])
    return templates.TemplateResponse(
        request,
        "batch.html",
        {
            "stream": f"/api/v1/batches/{batch_id}/events?after={after}",
            "progress": progress,
            "series": series,
            "cards": [_video_view(settings, v) for v in videos],
        },
    )


def series_page(request: Request) -> Response:
    series_id = request.path_params["series_id"]
    with session_scope(settings_of(request)) as session:
        series = _get(request, session, Series, series_id)
        if series is None:
            raise HTTPException(404, f"there is no series {series_id}")
        batches = list(session.scalars(sa.select(Batch).where(Batch.series_id == series_id).order_by(Batch.id)))
        progress = _progress(session, batches)
    return templates.TemplateResponse(request, "series.html", {"series": series, "progress": progress})


def ab_page(request: Request) -> Response:
    settings, test_id = settings_of(request), request.path_params["test_id"]
    with session_scope(settings) as session:
        test = _get(request, session, ABTest, test_id)
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
    from mas.learning import style_book

    settings, actor = settings_of(request), actor_of(request)
    items, unread = (
        style_book.entries(settings, actor),
        style_book.unread(settings, actor),
    )  # the items first: they may follow the block
    memory = visible_blocks(identity_of(request), blocks.read_all(settings, actor))
    return templates.TemplateResponse(
        request,
        "memory.html",
        {
            "memory": memory,
            "style": memory["user_style"],
            "winning": memory["ab_testing"]["WINNING_PATTERNS"],
            "items": items,
            "unread": unread,
            "sources": style_book.SOURCES,
        },
    )


def studio_metrics(request: Request) -> Response:
    """/metrics for admins (Prometheus scrapes with the operator's token or an admin's key): its figures
    cover every user's work."""
    if not identity_of(request).is_admin:
        raise HTTPException(403, "the studio's metrics cover every user's work: an admin's credential reads them")
    return metrics(request)


def frames(request: Request) -> Response:
    settings, video_id = settings_of(request), request.path_params["video_id"]
    with session_scope(settings) as session:
        mine = visible(identity_of(request), Batch.user_name)
        seen = sa.select(Video).join(Batch, Batch.id == Video.batch_id).where(Video.id == video_id, mine)
        video = session.scalars(seen).first() if is_row_id(video_id) else None
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
    settings, raw = settings_of(request), request.path_params["path"]
    if len(raw) > MAX_PATH_CHARS or any(len(part) > 255 for part in raw.split("/")):
        raise HTTPException(404, "no such file in the output folder (the path is too long)")
    if not raw.isprintable():  # NUL, a control character: no file the studio writes, and never asked of SQL
        raise HTTPException(404, f"no file {raw!r} in the output folder")
    path = storage(settings).local_file(raw) if _may_read(request, settings, raw) else None
    if path is None:
        raise HTTPException(404, f"no file {raw!r} in the output folder")
    return FileResponse(path)


def _may_read(request: Request, settings: Settings, key: str) -> bool:
    """An admin reads any stored video; a member only the files of their own videos."""
    identity = identity_of(request)
    if identity.scope() is None:
        return True  # everyone's: any stored video
    with session_scope(settings) as session:
        paths = session.scalars(
            sa.select(Video.output_path)
            .join(Batch, Batch.id == Video.batch_id)
            .where(visible(identity, Batch.user_name), Video.output_path.endswith(key, autoescape=True))
        ).all()
    return any(path and storage(settings).key_of(path) == key for path in paths)


# --- errors ---------------------------------------------------------------------------------------


def _error(request: Request, exc: Exception) -> Response:
    """A clear page (or JSON under /api) saying what was not found or refused."""
    assert isinstance(exc, HTTPException)
    message = f"there is no page {request.url.path}" if exc.detail == "Not Found" else exc.detail  # no route matched
    if request.url.path.startswith("/api/"):  # a path the API's routes never saw (a line break in it): a problem
        return problem(exc.status_code, message, kind="http")
    back = f"/ab/{request.path_params['test_id']}" if "test_id" in request.path_params else "/"
    context: dict[str, Any] = {"status": exc.status_code, "message": message, "back": back}
    return templates.TemplateResponse(request, "error.html", context, status_code=exc.status_code, headers=exc.headers)


def _unavailable(request: Request, exc: Exception) -> Response:
    """PostgreSQL can't be reached or started: say so (the message names the URL), instead of a bare 500."""
    message = str(exc)
    if isinstance(exc, sa.exc.OperationalError | sa.exc.InterfaceError):
        message = away_message(request.app.state.settings.database.url, exc)
    return templates.TemplateResponse(
        request, "error.html", {"status": 503, "message": message, "back": "/"}, status_code=503
    )
