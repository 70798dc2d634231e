"""Core memory: the six blocks of the seed's Appendix B, typed, versioned and capped.

Every agent reads the same row, so a write is seen by every reader at once. The blocks that hold a user's
taste (`PER_USER`) have one row per user (the `Actor` every call names); the others are the studio's, shared. A write locks the row
(SELECT ... FOR UPDATE), validates the whole new value against the block's schema, refuses it if the
serialized block would exceed the size cap (never truncates), bumps the version, stamps each changed
field and records the change (who, when, old, new). Two writers therefore never lose each other's update.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session
from typing_extensions import TypedDict

from mas.config import Settings
from mas.db import session_scope
from mas.domain.identity import Actor
from mas.errors import InvalidInput
from mas.grades import Grade
from mas.models import MemoryBlock, MemoryBlockChange, users_own
from mas.text import check_storable


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


KEEP = 20
"""The most recent entries a list field of a core block keeps; the full record is in PostgreSQL."""
KEEP_FAILED = 10
"""FAILED_RETRIES entries carry reasons, so fewer fit in the block."""
PENDING_SHOWN = 50
"""PENDING_VIDEOS lists the next videos of a batch; BATCH_TOTAL and BATCH_COMPLETE count them all."""

NO_ACTIVITY = "1970-01-01T00:00:00+00:00"
"""LAST_ACTIVITY before any activity: a fixed time, so a block no one has written reads the same every time."""


class PendingWork(TypedDict):
    """Unfinished work of a session, for `mas resume`."""

    batch_id: int
    request: str


class Variation(TypedDict):
    label: str
    video_id: int
    approach: str


class Selection(TypedDict):
    """One A/B pick."""

    test: str
    label: str
    approach: str
    concept: str


class FinishedVideo(TypedDict):
    video_id: int
    batch_id: int
    grade: str | None
    attempts: int


class FailedVideo(FinishedVideo):
    reasons: list[str]


class _Block(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True)


class SessionState(_Block):
    LAST_ACTIVITY: str = Field(default=NO_ACTIVITY, description="ISO timestamp of the last activity.")
    PENDING_WORK: list[PendingWork] = Field(default_factory=list)
    IN_PROGRESS_PROJECT: str | None = None
    QUEUED_VIDEOS: list[int] = Field(default_factory=list)
    LAST_SESSION_SUMMARY: str | None = None

    @field_validator("LAST_ACTIVITY")
    @classmethod
    def _iso(cls, value: str) -> str:
        datetime.fromisoformat(value)
        return value


class StyleItemValue(TypedDict):
    """One preference (`mas.agents.style.StyleItem`): its aspect, words, polarity and where it came from."""

    aspect: Literal["colour", "mood", "theme", "pacing", "other"]
    words: str
    polarity: Literal["liked", "ruled_out"]
    feedback: str
    at: str


class StyleChange(TypedDict):
    """A later feedback that turned an earlier item round ("purple" liked, then "no purple")."""

    words: str
    was: str
    now: str
    feedback: str
    at: str


class UserStyle(_Block):
    """The seed's fields are written from ITEMS when feedback is learned; an operator may still set them."""

    COLOR_PREFERENCES: str = ""
    MOOD_PREFERENCES: str = ""
    THEME_PREFERENCES: str = ""
    PACING_PREFERENCES: str = ""
    FAVORITE_SUCCESSES: list = Field(default_factory=list)
    DISLIKED_ELEMENTS: list = Field(default_factory=list)
    ITEMS: list[StyleItemValue] = Field(default_factory=list)
    ITEM_HISTORY: list[StyleChange] = Field(default_factory=list)


class QualityStandards(_Block):
    MIN_ACCEPTABLE_GRADE: Grade = "B"
    MAX_RETRIES: int = Field(default=3, ge=1, le=20)
    FAILURE_PATTERNS_TO_AVOID: list = Field(default_factory=list)
    REFINEMENT_STRATEGIES: list = Field(default_factory=list)
    SUCCESSFUL_PATTERNS: list = Field(default_factory=list)
    PROVEN_PROMPT_TEMPLATES: list = Field(default_factory=list)


class ProductionQueue(_Block):
    QUEUE_STATUS: Literal["active", "paused", "complete"] = "complete"
    PENDING_VIDEOS: list[int] = Field(default_factory=list)
    IN_PROGRESS: str | None = None
    COMPLETED_TODAY: list[FinishedVideo] = Field(default_factory=list)
    FAILED_RETRIES: list[FailedVideo] = Field(default_factory=list)
    BATCH_ID: str = ""
    BATCH_TOTAL: int = Field(default=0, ge=0)
    BATCH_COMPLETE: int = Field(default=0, ge=0)


class CurrentSeries(_Block):
    ACTIVE_SERIES: str | None = None
    SERIES_THEME: str = ""
    SERIES_STYLE: str = ""
    EPISODES_COMPLETED: int = Field(default=0, ge=0)
    EPISODES_PLANNED: int = Field(default=0, ge=0)
    SERIES_ELEMENTS: list = Field(default_factory=list)
    CONSISTENCY_RULES: list = Field(default_factory=list)


class ABTesting(_Block):
    ACTIVE_TEST: str | None = None
    VARIATIONS: list[Variation] = Field(default_factory=list)
    VARIATION_A_ID: str = ""
    VARIATION_B_ID: str = ""
    USER_SELECTIONS: list[Selection] = Field(default_factory=list)
    WINNING_PATTERNS: list = Field(default_factory=list)


SCHEMAS: dict[str, type[_Block]] = {
    "session_state": SessionState,
    "user_style": UserStyle,
    "quality_standards": QualityStandards,
    "production_queue": ProductionQueue,
    "current_series": CurrentSeries,
    "ab_testing": ABTesting,
}


PER_USER = ("user_style", "ab_testing")
"""Blocks that hold one user's taste (style, A/B picks): one row per user, so one user's picks never move
another's. A user with no row yet reads the defaults, the studio's default taste."""


class BlockError(InvalidInput):
    """An update a block refuses: unknown label or field, wrong type, or over the size cap."""


def row_label(actor: Actor, label: str) -> str:
    """The row that holds `label` for `actor`: `label` itself, or `label@user` for a per-user block of
    a named user (the default user keeps the plain rows, which a studio had before users existed)."""
    _schema(label)
    return users_own(label, actor.user) if label in PER_USER else label


def _schema(label: str) -> type[_Block]:
    try:
        return SCHEMAS[label]
    except KeyError:
        raise BlockError(f"unknown memory block {label!r}; blocks are: {', '.join(SCHEMAS)}") from None


def defaults(label: str, settings: Settings) -> dict[str, Any]:
    """The initial value of a block: every field set, quality thresholds from settings."""
    value = _schema(label)().model_dump()
    if label == "quality_standards":
        value.update(
            MIN_ACCEPTABLE_GRADE=settings.quality.min_acceptable_grade, MAX_RETRIES=settings.quality.max_retries
        )
    return value


def _unwritten(settings: Settings, actor: Actor, label: str) -> MemoryBlock:
    """A block no one has written yet, as it reads: its defaults at version 1, no field changed. Its row is
    made by the first write, so reading (a page, `mas memory show`, a new user) writes nothing."""
    return MemoryBlock(label=row_label(actor, label), value=defaults(label, settings), field_updated_at={}, version=1)


def read(settings: Settings, actor: Actor, label: str) -> dict[str, Any]:
    """The current value of one block as `actor` reads it (its defaults until it is first written)."""
    return dict(versioned(settings, actor, label).value)


def read_all(settings: Settings, actor: Actor) -> dict[str, dict[str, Any]]:
    """Every block as `actor` sees it (their own per-user blocks, the shared rest), by label."""
    keys = {row_label(actor, label): label for label in SCHEMAS}
    with session_scope(settings) as session:
        stored = {
            row.label: dict(row.value)
            for row in session.scalars(sa.select(MemoryBlock).where(MemoryBlock.label.in_(keys)))
        }
    return {label: stored[key] if key in stored else defaults(label, settings) for key, label in keys.items()}


def versioned(settings: Settings, actor: Actor, label: str) -> MemoryBlock:
    """The block row itself: value, version and per-field change times (`_unwritten` until first written)."""
    with session_scope(settings) as session:
        return session.get(MemoryBlock, row_label(actor, label)) or _unwritten(settings, actor, label)


Change = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]


def apply_change(settings: Settings, label: str, current: dict[str, Any], change: Change) -> dict[str, Any]:
    """The block's new value after `change`, validated and within the size cap, or BlockError.

    Shared by every store of the blocks (Postgres here, a Letta server in `mas.agents.letta`).
    """
    schema = _schema(label)
    fields = change(dict(current)) if callable(change) else dict(change)
    unknown = set(fields) - set(schema.model_fields)
    if unknown:
        raise BlockError(f"{label} has no field {', '.join(sorted(unknown))}; fields: {', '.join(schema.model_fields)}")
    check_storable(fields, f"the new value of {label}")
    try:
        new = schema.model_validate({**current, **fields}).model_dump()
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise BlockError(f"{label}.{where}: {err['msg']}") from None
    size = len(json.dumps(new))
    if size > settings.memory.core_block_max_chars:
        raise BlockError(
            f"{label} would be {size} characters, over its cap of {settings.memory.core_block_max_chars}; "
            "move old entries to archival memory first"
        )
    return new


def update(
    settings: Settings, actor: Actor, label: str, change: Change, *, by: str, session: Session | None = None
) -> dict[str, Any]:
    """Apply `change` atomically and return the new value.

    `change` is either a dict of fields to set, or a function from the current value to the fields to
    set (for read-modify-write such as counters and list appends, run under the row lock). `actor` is whose
    block a per-user label is; `by` who made the change (kept in its history). Pass
    `session` to make the change part of a larger transaction (committed or rolled back with it).
    """
    if session is None:
        with session_scope(settings) as own:
            return update(settings, actor, label, change, by=by, session=own)
    schema = _schema(label)
    row_key = row_label(actor, label)
    locked = sa.select(MemoryBlock).where(MemoryBlock.label == row_key).with_for_update()
    row = session.execute(locked).scalar_one_or_none()
    if row is None:  # the first write of this block: its row starts as `_unwritten` reads
        first = _unwritten(settings, actor, label)
        session.execute(
            pg_insert(MemoryBlock)
            .values(
                label=row_key,
                value=first.value,
                field_updated_at={},
                version=first.version,
            )
            .on_conflict_do_nothing(index_elements=["label"])
        )
        row = session.execute(locked).scalar_one()
    current = dict(row.value)
    new = apply_change(settings, label, current, change)
    changed = [f for f in schema.model_fields if new[f] != current.get(f)]
    if not changed:
        return new
    stamp = now_iso()
    row.version += 1
    row.value = new
    row.field_updated_at = {**row.field_updated_at, **dict.fromkeys(changed, stamp)}
    row.updated_at = sa.func.now()
    session.add_all(
        MemoryBlockChange(label=row_key, version=row.version, field=f, old=current.get(f), new=new[f], actor=by)
        for f in changed
    )
    return new


def set_field(
    settings: Settings, actor: Actor, label: str, field: str, raw: str, *, by: str = "user"
) -> dict[str, Any]:
    """Set one field from command-line text: JSON when it parses (3, ["a"], null), else a string."""
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return update(settings, actor, label, {field: value}, by=by)


def history(settings: Settings, actor: Actor, label: str, *, limit: int = 50) -> list[MemoryBlockChange]:
    """The most recent changes of a block as `actor` reads it, newest first."""
    row_key = row_label(actor, label)
    with session_scope(settings) as session:
        stmt = (
            sa.select(MemoryBlockChange)
            .where(MemoryBlockChange.label == row_key)
            .order_by(MemoryBlockChange.id.desc())
            .limit(limit)
        )
        return list(session.scalars(stmt))
