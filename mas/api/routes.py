"""The JSON API's routes: submit and follow work, act on it, pick A/B winners, read memory.

Every route acts through the same core functions as the CLI and the gallery's buttons (`production.submit`,
`control.cancel_batch`, `preferences.pick`, ...), so a program driving the studio gets exactly what a person
at the terminal gets. Reads come from PostgreSQL; nothing here keeps state.

Who acts is the caller the credential proved (`mas.api.callers`): a member's requests are theirs, and another
user's batch, video or test is "not found" to them, exactly as one that does not exist; an admin sees
everyone's and acts for a user it names. Every listing and fetch applies the one visibility rule
(`mas.accounts.visibility.visible`) in its query.
"""

from __future__ import annotations

from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import APIRouter, Header, Query, Request, Response
from sqlalchemy.orm import selectinload
from starlette.responses import FileResponse

from mas.accounts.visibility import visible, visible_blocks
from mas.api.callers import actor_of, identity_of, settings_of
from mas.api.idempotency import once
from mas.api.problems import Conflict, NotFound
from mas.api.schemas import ABTestOut, BatchOut, BatchRequest, Pick, Submitted, VideoOut
from mas.config import Settings
from mas.db import is_row_id, session_scope
from mas.domain.identity import Actor
from mas.domain.requests import ProductionRequest, parse_request
from mas.errors import InvalidInput
from mas.models import ABTest, Batch, BatchStatus, Video
from mas.reports import queries

router = APIRouter()
PROBLEM = {"model": dict, "content": {"application/problem+json": {}}, "description": "A problem (RFC 9457)."}
ERRORS: dict[int | str, dict[str, Any]] = {404: PROBLEM, 409: PROBLEM, 422: PROBLEM, 503: PROBLEM}
SUBMIT_ERRORS: dict[int | str, dict[str, Any]] = {
    **ERRORS,
    429: {**PROBLEM, "description": "A quota of the user is full now (a problem, with `Retry-After` in seconds)."},
}


def _request_of(body: BatchRequest, settings: Settings) -> ProductionRequest:
    if body.kind == "series":
        if not body.series_name:
            raise InvalidInput("a series request needs series_name")
        return ProductionRequest.series(body.series_name, episodes=body.count or 1, settings=settings)
    if body.kind == "ab":
        if not body.concept:
            raise InvalidInput("an A/B request needs concept")
        return ProductionRequest.ab(body.concept, variations=body.count or 3, settings=settings)
    if body.request is not None:
        if body.theme is not None or body.count is not None:
            raise InvalidInput("give either request (in words) or theme and count, not both")
        return parse_request(body.request, settings)
    if body.theme is None or body.count is None:
        raise InvalidInput("a batch needs request (in words), or theme and count")
    return ProductionRequest.batch(body.theme, count=body.count, settings=settings)


@router.post("/batches", status_code=201, response_model=Submitted, responses=SUBMIT_ERRORS, tags=["batches"])
def submit(
    body: BatchRequest,
    request: Request,
    response: Response,
    idempotency_key: Annotated[
        str | None, Header(description="Retry-safe submits: the same key makes one batch.")
    ] = None,
) -> Submitted:
    """Submit a batch, a series' next episodes or an A/B test, now or at a time (`at`). A submit beyond the
    user's quotas is refused whole: 429 with `Retry-After` while a quota is full, 422 for a request larger than
    a quota allows; a schedule is counted when it runs."""
    from mas.pipeline import production

    settings, actor = settings_of(request), actor_of(request, body.user)
    production_request = _request_of(body, settings)

    def run() -> tuple[int | None, int | None]:
        if body.at is not None:
            schedule_id = production.schedule(
                settings, actor, production_request, run_at=body.at, priority=body.priority, notify_url=body.notify_url
            )
            return None, schedule_id
        batch_id = production.submit(
            settings, actor, production_request, priority=body.priority, notify_url=body.notify_url
        )
        return batch_id, None

    if idempotency_key is None:
        batch_id, schedule_id = run()
        made = Submitted(batch_id=batch_id, schedule_id=schedule_id, replayed=False)
    else:
        done = once(settings, actor, idempotency_key, body.model_dump(mode="json"), run)
        made = Submitted(batch_id=done.batch_id, schedule_id=done.schedule_id, replayed=done.replayed)
        if done.replayed:
            response.status_code = 200
    if made.batch_id is not None:
        response.headers["Location"] = f"/api/v1/batches/{made.batch_id}"
    return made


@router.get("/batches", response_model=list[BatchOut], responses=ERRORS, tags=["batches"])
def list_batches(
    request: Request,
    status: Annotated[str | None, Query(description="Only batches in this status.")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> list[BatchOut]:
    """The newest batches, newest first, with their progress."""
    statuses = {s.value for s in BatchStatus}
    if status is not None and status not in statuses:
        raise InvalidInput(f"unknown status {status!r}; use one of {', '.join(sorted(statuses))}")
    with session_scope(settings_of(request)) as session:
        stmt = sa.select(Batch).where(visible(identity_of(request), Batch.user_name))
        stmt = stmt.order_by(Batch.id.desc()).limit(limit)
        if status is not None:
            stmt = stmt.where(Batch.status == BatchStatus(status))
        batches = session.scalars(stmt).all()
        counts = queries.outcomes(session, [b.id for b in batches])
        return [BatchOut.of(b, counts=counts.get(b.id)) for b in batches]


def _batch(request: Request, batch_id: int) -> BatchOut:
    settings = settings_of(request)
    with session_scope(settings) as session:
        mine = sa.select(Batch).where(Batch.id == batch_id, visible(identity_of(request), Batch.user_name))
        batch = session.scalars(mine).first() if is_row_id(batch_id) else None
        if batch is None:
            raise NotFound(f"there is no batch {batch_id}")
        videos = list(session.scalars(sa.select(Video).where(Video.batch_id == batch_id).order_by(Video.position)))
        return BatchOut.of(batch, videos, places=queries.places(settings, session, batch_id))


@router.get("/batches/{batch_id}", response_model=BatchOut, responses=ERRORS, tags=["batches"])
def get_batch(batch_id: int, request: Request) -> BatchOut:
    """One batch with its videos; each on its way to the GPU says the renders ahead of it and an estimated start."""
    return _batch(request, batch_id)


@router.post("/batches/{batch_id}/{action}", response_model=BatchOut, responses=ERRORS, tags=["batches"])
def act_on_batch(batch_id: int, action: str, request: Request) -> BatchOut:
    """cancel, pause or continue a batch (as `mas cancel`, `mas pause`, `mas continue`)."""
    from mas.pipeline import control

    actions = {"cancel": control.cancel_batch, "pause": control.pause_batch, "continue": control.continue_batch}
    if action not in actions:
        raise NotFound(f"no action {action!r} on a batch: cancel, pause or continue")
    _batch(request, batch_id)  # 404 before anything is tried
    try:
        actions[action](settings_of(request), batch_id)
    except control.NotChangeable as exc:
        raise Conflict(str(exc)) from None
    return _batch(request, batch_id)


def _visible_video(request: Request, video_id: int) -> sa.Select[Video]:
    """The video, if the caller may see its batch (`visible`)."""
    mine = visible(identity_of(request), Batch.user_name)
    return sa.select(Video).join(Batch, Batch.id == Video.batch_id).where(Video.id == video_id, mine)


@router.get("/videos/{video_id}", response_model=VideoOut, responses=ERRORS, tags=["videos"])
def get_video(video_id: int, request: Request) -> VideoOut:
    """One video with every attempt (prompt, grade, scores, reasons)."""
    settings = settings_of(request)
    with session_scope(settings) as session:
        video = (
            session.scalars(
                _visible_video(request, video_id).options(selectinload(Video.attempts), selectinload(Video.batch))
            ).first()
            if is_row_id(video_id)
            else None
        )
        if video is None:
            raise NotFound(f"there is no video {video_id}")
        place = queries.places(settings, session, video.batch_id).get(video.id)
        return VideoOut.of(video, with_attempts=True, place=place)


@router.get("/videos/{video_id}/file", responses={**ERRORS, 200: {"content": {"video/mp4": {}}}}, tags=["videos"])
def video_file(video_id: int, request: Request) -> FileResponse:
    """The video's mp4 (with range requests), wherever the storage keeps it."""
    from mas.storage import local_copy

    settings = settings_of(request)
    with session_scope(settings) as session:
        video = session.scalars(_visible_video(request, video_id)).first() if is_row_id(video_id) else None
        if video is None:
            raise NotFound(f"there is no video {video_id}")
        location = video.output_path
    path = local_copy(settings, location)
    if path is None:
        raise NotFound(f"video {video_id} has no file yet" if not location else f"the file of video {video_id} is gone")
    return FileResponse(path, media_type="video/mp4")


@router.get("/ab/{test_id}", response_model=ABTestOut, responses=ERRORS, tags=["ab"])
def get_ab_test(test_id: int, request: Request) -> ABTestOut:
    """An A/B test, its variations and whether it is ready for a pick."""
    with session_scope(settings_of(request)) as session:
        test = (
            session.scalars(
                sa.select(ABTest)
                .options(selectinload(ABTest.variations))
                .where(ABTest.id == test_id, visible(identity_of(request), ABTest.user_name))
            ).first()
            if is_row_id(test_id)
            else None
        )
        if test is None:
            raise NotFound(f"there is no A/B test {test_id}")
        ids = [v.video_id for v in test.variations if v.video_id is not None]
        videos = {v.id: v for v in session.scalars(sa.select(Video).where(Video.id.in_(ids)))}
        return ABTestOut.of(test, videos)


@router.post("/ab/{test_id}/pick", response_model=ABTestOut, responses=ERRORS, tags=["ab"])
def pick_winner(test_id: int, body: Pick, request: Request) -> ABTestOut:
    """Record the user's winner (as `mas pick`): the studio learns the user's taste from it."""
    from mas.learning.preferences import PreferenceError, pick

    owner = get_ab_test(test_id, request).user  # 404 before anything is tried
    named = identity_of(request).acts_for(body.user)
    if body.user is not None and named != owner:
        raise InvalidInput(f"A/B test {test_id} is {owner}'s: a pick on it is theirs")
    try:
        pick(settings_of(request), Actor(owner), test_id, body.label)
    except PreferenceError as exc:
        raise Conflict(str(exc)) from None
    return get_ab_test(test_id, request)


@router.get("/memory/blocks", response_model=dict[str, dict[str, Any]], responses=ERRORS, tags=["memory"])
def memory_blocks(
    request: Request, user: Annotated[str | None, Query(description="Whose taste blocks.")] = None
) -> dict[str, dict[str, Any]]:
    """Every core memory block (the taste blocks of `user`); a member reads their own taste blocks only."""
    return _blocks(request, user)


def _blocks(request: Request, user: str | None) -> dict[str, dict[str, Any]]:
    from mas.memory import blocks

    return visible_blocks(identity_of(request), blocks.read_all(settings_of(request), actor_of(request, user)))


@router.get("/memory/blocks/{label}", response_model=dict[str, Any], responses=ERRORS, tags=["memory"])
def memory_block(
    label: str, request: Request, user: Annotated[str | None, Query(description="Whose taste blocks.")] = None
) -> dict[str, Any]:
    """One core memory block."""
    everything = _blocks(request, user)
    if label not in everything:
        raise NotFound(f"there is no block {label!r}; blocks: {', '.join(sorted(everything))}")
    return everything[label]
