"""The user's style over the API: list the items with where each came from, add one as given, turn one round,
remove one (`mas.learning.style_book`, what `mas style` and the gallery's memory page do).

Whose style is the credential's (an admin may name a user with `user`); never a body field. A member's request
for another user's item finds nothing: "not found", exactly as an item that does not exist.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from mas.api.callers import actor_of, settings_of
from mas.api.problems import NotFound
from mas.api.routes import PROBLEM
from mas.learning import style_book

router = APIRouter(tags=["style"])
ERRORS: dict[int | str, dict] = {403: PROBLEM, 404: PROBLEM, 422: PROBLEM}
WHOSE = Query(description="Whose style: the caller's by default; only an admin names another user.")


class EarlierState(BaseModel):
    """What an item was before a change."""

    words: str
    polarity: Literal["liked", "ruled_out"]
    source: str = Field(description="Where that reading came from (see StyleItemOut.source).")
    feedback: str = Field(description="The feedback it was read from, when it was.")
    at: str = Field(description="When it was stored.")
    until: str = Field(description="When it was changed.")


class StyleItemOut(BaseModel):
    """One item of the user's style: liked or ruled out, where it came from and what it was before."""

    id: int
    aspect: str = Field(description="colour, mood, theme, pacing or other.")
    words: str
    polarity: Literal["liked", "ruled_out"]
    says: str = Field(description='The item in a sentence: "likes: golden light (colour)".')
    source: Literal["studio", "model", "user", "correction", "block"] = Field(
        description="studio / model: read from feedback by the studio's rules / by the model; user: given as is; "
        "correction: the user turned a reading round; block: set in the memory block directly."
    )
    feedback: str = Field(description="The feedback it was read from, or how it was given.")
    at: datetime
    history: list[EarlierState] = Field(description="What it was before each change, oldest first.")

    @classmethod
    def of(cls, entry: style_book.Entry) -> StyleItemOut:
        return cls.model_validate(
            {
                "id": entry.id,
                "aspect": entry.aspect,
                "words": entry.words,
                "polarity": entry.polarity,
                "says": entry.sentence(),
                "source": entry.source,
                "feedback": entry.feedback,
                "at": entry.at,
                "history": entry.history,
            }
        )


class NotUnderstood(BaseModel):
    """Clauses of one feedback the reader did not understand: never stored or applied; say them plainly as
    items (POST /style/items)."""

    feedback: str
    clauses: list[str]
    at: datetime


class StyleOut(BaseModel):
    """A user's style: the items and the latest feedback not understood."""

    user: str
    items: list[StyleItemOut]
    not_understood: list[NotUnderstood]


class NewItem(BaseModel):
    """An item stored exactly as given (no reading): it replaces an item about the same thing."""

    model_config = ConfigDict(extra="forbid")

    words: str = Field(
        min_length=1, max_length=style_book.WORDS_MAX_CHARS, description="A few words.", examples=["handheld camera"]
    )
    polarity: Literal["liked", "ruled_out"]


@router.get("/style/items", response_model=StyleOut, responses=ERRORS)
def list_style_items(request: Request, user: Annotated[str | None, WHOSE] = None) -> StyleOut:
    """The user's style items, oldest first, each with where it came from and its history."""
    settings, actor = settings_of(request), actor_of(request, user)
    return StyleOut(
        user=actor.user,
        items=[StyleItemOut.of(e) for e in style_book.entries(settings, actor)],
        not_understood=[
            NotUnderstood(feedback=u.feedback, clauses=u.clauses, at=u.at) for u in style_book.unread(settings, actor)
        ],
    )


@router.post("/style/items", status_code=201, response_model=StyleItemOut, responses=ERRORS)
def add_style_item(body: NewItem, request: Request, user: Annotated[str | None, WHOSE] = None) -> StyleItemOut:
    """Store an item as given (as `mas style --like` / `--avoid`); turning an item round is a correction."""
    changed = style_book.give(settings_of(request), actor_of(request, user), body.words, liked=body.polarity == "liked")
    return StyleItemOut.of(changed.entries[0])


@router.post("/style/items/{item_id}/flip", response_model=StyleItemOut, responses=ERRORS)
def flip_style_item(item_id: int, request: Request, user: Annotated[str | None, WHOSE] = None) -> StyleItemOut:
    """Turn an item round (liked <-> ruled out): a correction, with its history."""
    try:
        return StyleItemOut.of(style_book.flip(settings_of(request), actor_of(request, user), item_id).entries[0])
    except style_book.UnknownItem as exc:
        raise NotFound(str(exc)) from None


@router.delete("/style/items/{item_id}", response_model=StyleItemOut, responses=ERRORS)
def remove_style_item(item_id: int, request: Request, user: Annotated[str | None, WHOSE] = None) -> StyleItemOut:
    """Remove an item (as `mas style forget`); answers the item removed."""
    try:
        return StyleItemOut.of(style_book.forget(settings_of(request), actor_of(request, user), item_id))
    except style_book.UnknownItem as exc:
        raise NotFound(str(exc)) from None
