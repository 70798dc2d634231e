"""The gallery's buttons that change work or teach taste: cancel, pause or continue a batch, pick an A/B
winner, turn a style item round or remove it, exactly as `mas cancel`, `mas pause`, `mas continue`, `mas pick`,
`mas style --like/--avoid` and `mas style forget` do."""

from __future__ import annotations

from urllib.parse import urlsplit

import sqlalchemy as sa
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from mas.accounts.visibility import visible
from mas.api.callers import actor_of, identity_of, settings_of
from mas.db import session_scope
from mas.domain.identity import Actor
from mas.models import ABTest, Batch


def refuse_cross_site(request: Request, what: str) -> None:
    """A page on another site could post a form for the user (CSRF): browsers always send Origin on a
    cross-site POST, and a page of this gallery sends its own host."""
    origin = request.headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != request.headers.get("host"):
        raise HTTPException(403, f"{what} sent from another site was refused; nothing changed")


def batch_action(request: Request) -> Response:
    """POST /batches/{id}/cancel | pause | continue, then show the batch (post/redirect/get)."""
    # imported here, as `mas.cli` does: it loads the Celery app, which reads its settings on import
    from mas.pipeline import control

    actions = {"cancel": control.cancel_batch, "pause": control.pause_batch, "continue": control.continue_batch}
    batch_id, action = request.path_params["batch_id"], request.path_params["action"]
    if action not in actions:
        raise HTTPException(404, f"no such action {action!r}: cancel, pause or continue")
    refuse_cross_site(request, f"a {action} request")
    settings = settings_of(request)
    with session_scope(settings) as session:
        mine = sa.select(Batch.id).where(Batch.id == batch_id, visible(identity_of(request), Batch.user_name))
        if session.scalar(mine) is None:
            raise HTTPException(404, f"there is no batch {batch_id}; nothing changed")
    try:
        actions[action](settings, batch_id)
    except control.NotChangeable as exc:
        raise HTTPException(409, str(exc)) from None
    return RedirectResponse(f"/batches/{batch_id}", status_code=303)


def pick_winner(request: Request) -> Response:
    """Record the winner exactly as `mas pick` does, then show the test (post/redirect/get)."""
    # imported here, as `mas.cli` does: it loads the Celery app, which reads its settings on import
    from mas.learning.preferences import PreferenceError, pick

    test_id = request.path_params["test_id"]
    refuse_cross_site(request, "a pick")
    settings = settings_of(request)
    with session_scope(settings) as session:
        mine = sa.select(ABTest.user_name).where(ABTest.id == test_id, visible(identity_of(request), ABTest.user_name))
        owner = session.scalar(mine)
        if owner is None:
            raise HTTPException(404, f"there is no A/B test {test_id}; nothing changed")
    try:
        pick(settings, Actor(owner), test_id, request.path_params["label"])
    except PreferenceError as exc:
        raise HTTPException(409, str(exc)) from None
    return RedirectResponse(f"/ab/{test_id}", status_code=303)


def style_action(request: Request) -> Response:
    """POST /memory/style/{id}/flip | forget: turn the caller's style item round or remove it, then show the
    memory page (post/redirect/get). Another user's item is not found, as one that does not exist."""
    from mas.learning import style_book

    actions = {"flip": style_book.flip, "forget": style_book.forget}
    item_id, action = request.path_params["item_id"], request.path_params["action"]
    if action not in actions:
        raise HTTPException(404, f"no such action {action!r} on a style item: flip or forget")
    refuse_cross_site(request, f"a style {action}")
    try:
        actions[action](settings_of(request), actor_of(request), item_id)
    except style_book.UnknownItem as exc:
        raise HTTPException(404, str(exc)) from None
    return RedirectResponse("/memory#style-items", status_code=303)
