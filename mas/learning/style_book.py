"""A user's style items, each with where it came from and what it was before: the record the user reads and
corrects (`mas style show`, the API, the gallery's memory page), and what the `user_style` block is written from.

The block stays what every prompt is built from; each change here rewrites it in the same transaction, under
its row lock. An item someone set in the block directly (`mas memory set`) is taken into the record as it is
(source "block"), and one removed there is removed here, so the two never say different things.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from mas.agents.style import FEEDBACK_CHARS, ITEMS_KEPT, Style, StyleItem, aspect_of, normalized, stamped
from mas.config import Settings
from mas.db import session_scope
from mas.domain.identity import Actor
from mas.errors import InvalidInput
from mas.memory import blocks
from mas.models import StyleFeedback, StyleItemRow
from mas.text import check_storable

SOURCES = {
    "studio": "read from feedback by the studio's rules",
    "model": "read from feedback by the model",
    "user": "given as is",
    "correction": "corrected by the user",
    "block": "set in the memory block",
}
"""Where an item came from, and how it is said."""

HISTORY_SHOWN = 3
"""Changes of earlier items the block keeps however many items it holds (the rest are in its history)."""

WORDS_MAX_CHARS = 80
"""An item given as is is a few words: "handheld camera", not a paragraph."""

NOT_UNDERSTOOD_SHOWN = 5
"""Feedbacks with clauses not understood that a listing shows, newest first."""


class UnknownItem(InvalidInput):
    """The user has no such item; nothing changed."""


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One item as the user sees it."""

    id: int
    aspect: str
    words: str
    liked: bool
    source: str
    feedback: str
    at: datetime
    history: list[dict[str, str]]

    @property
    def polarity(self) -> str:
        return "liked" if self.liked else "ruled_out"

    def sentence(self) -> str:
        """ "likes: purple (colour)" or "rules out: handheld camera (other)"."""
        return f"{'likes' if self.liked else 'rules out'}: {self.words} ({self.aspect})"

    @classmethod
    def of(cls, row: StyleItemRow) -> Entry:
        return cls(
            id=row.id,
            aspect=row.aspect,
            words=row.words,
            liked=row.polarity == "liked",
            source=row.source,
            feedback=row.feedback,
            at=row.updated_at,
            history=list(row.history),
        )


@dataclass(frozen=True, kw_only=True)
class Unread:
    """Clauses of one feedback the reader did not understand."""

    feedback: str
    clauses: list[str]
    at: datetime


def _item(row: StyleItemRow) -> StyleItem:
    return StyleItem(
        aspect=row.aspect,
        words=row.words,
        liked=row.polarity == "liked",
        feedback=row.feedback[:FEEDBACK_CHARS],
        at=row.updated_at.isoformat(timespec="seconds"),
    )


def _rows(session: Session, user: str) -> list[StyleItemRow]:
    stmt = (
        sa.select(StyleItemRow).where(StyleItemRow.user_name == user).order_by(StyleItemRow.updated_at, StyleItemRow.id)
    )
    return list(session.scalars(stmt))


def _in_step(rows: Sequence[StyleItemRow], block: dict[str, Any]) -> bool:
    """Whether the record and the block hold the same items (nobody changed the block directly)."""
    held = {(i.key, i.liked) for i in Style.of(block).items}
    return held == {(_item(r).key, r.polarity == "liked") for r in rows}


def _stamp(row: StyleItemRow, at: datetime) -> dict[str, str]:
    """What `row` was, for its history, and now."""
    return {"at": row.updated_at.isoformat(timespec="seconds"), "words": row.words, "polarity": row.polarity,
            "source": row.source, "feedback": row.feedback[:FEEDBACK_CHARS], "until": at.isoformat(timespec="seconds")}  # fmt: skip


def _set(row: StyleItemRow, item: StyleItem, *, source: str, feedback: str, at: datetime) -> dict[str, str] | None:
    """Make `row` say `item`, its earlier state kept in its history; the change of the block's ITEM_HISTORY
    when this turns it round."""
    polarity = "liked" if item.liked else "ruled_out"
    turned = None
    if row.id is not None or row.words:
        row.history = [*row.history, _stamp(row, at)]
        if row.polarity != polarity:
            turned = {"words": row.words, "was": row.polarity, "now": f"{polarity}: {item.words}",
                      "feedback": feedback[:FEEDBACK_CHARS], "at": at.isoformat(timespec="seconds")}  # fmt: skip
    row.aspect, row.words, row.polarity = item.aspect, item.words, polarity
    row.source, row.feedback, row.updated_at = source, feedback, at
    return turned


Operation = Callable[[list[StyleItemRow], datetime], tuple[list[StyleItemRow], list[dict[str, str]]]]
"""The user's rows in their order (changed in place) and the time -> (the rows touched, the block's new
ITEM_HISTORY changes)."""


@dataclass(frozen=True, kw_only=True)
class Changed:
    """What a change did: the items it stored, those it turned round (ITEM_HISTORY's changes), the block."""

    entries: list[Entry]
    turned: list[dict[str, str]]
    block: dict[str, Any]


def _change(settings: Settings, actor: Actor, operate: Operation, *, by: str) -> Changed:
    """Apply `operate` to the user's items and rewrite `user_style` from them, in one transaction: the
    items touched become the newest; the oldest go first over ITEMS_KEPT or the block's cap (never those
    touched now), and the record keeps exactly what the block holds."""
    done: list[tuple[list[StyleItemRow], list[dict[str, str]]]] = []
    with session_scope(settings) as session:

        def change(current: dict[str, Any]) -> dict[str, Any]:
            rows = _synced(session, actor.user, current)
            present = list(rows)
            touched, changes = operate(rows, datetime.now(UTC))
            done.append((touched, changes))
            kept = ([r for r in rows if r not in touched] + [r for r in touched if r in rows])[-ITEMS_KEPT:]
            history = [*current.get("ITEM_HISTORY", []), *changes]
            fields = Style(items=tuple(_item(r) for r in kept)).block_fields(history)
            while len(json.dumps({**current, **fields})) > settings.memory.core_block_max_chars and (
                history or len(kept) > len(touched)
            ):
                if len(history) > HISTORY_SHOWN or (history and len(kept) <= len(touched)):
                    history = history[1:]
                else:
                    kept = kept[1:]
                fields = Style(items=tuple(_item(r) for r in kept)).block_fields(history)
            for row in present:
                if row not in kept:
                    session.delete(row)
            session.add_all(r for r in kept if r not in present)
            return fields

        block = blocks.update(settings, actor, "user_style", change, by=by, session=session)
        session.flush()
        touched, changes = done[0]
        return Changed(entries=[Entry.of(r) for r in touched], turned=changes, block=block)


def _synced(session: Session, user: str, block: dict[str, Any]) -> list[StyleItemRow]:
    """The user's rows after following the block: an item only the block holds is taken in (source "block"),
    a row the block no longer holds is removed."""
    rows = _rows(session, user)
    if _in_step(rows, block):
        return rows
    held = Style.of(block).items
    kept = []
    for row in rows:
        if any(i.key == _item(row).key and i.liked == (row.polarity == "liked") for i in held):
            kept.append(row)
        else:
            session.delete(row)
    taken = {(_item(r).key, r.polarity) for r in kept}
    for i in held:
        if (i.key, "liked" if i.liked else "ruled_out") not in taken:
            at = datetime.fromisoformat(i.at) if i.at else datetime.now(UTC)
            row = StyleItemRow(user_name=user, history=[])
            _set(row, i, source="block", feedback=i.feedback, at=at)
            session.add(row)
            kept.append(row)
    session.flush()
    return sorted(kept, key=lambda r: (r.updated_at, r.id))


def entries(settings: Settings, actor: Actor) -> list[Entry]:
    """The user's items, oldest first, with where each came from and its history."""
    with session_scope(settings) as session:
        rows = _rows(session, actor.user)
        if _in_step(rows, blocks.read(settings, actor, "user_style")):
            return [Entry.of(r) for r in rows]
    _change(settings, actor, lambda rows, at: ([], []), by="user (items taken from the block)")  # noqa: ARG005
    with session_scope(settings) as session:
        return [Entry.of(r) for r in _rows(session, actor.user)]


def unread(settings: Settings, actor: Actor, *, limit: int = NOT_UNDERSTOOD_SHOWN) -> list[Unread]:
    """The user's latest feedbacks that had clauses the reader did not understand, newest first."""
    with session_scope(settings) as session:
        stmt = (
            sa.select(StyleFeedback)
            .where(StyleFeedback.user_name == actor.user, sa.func.jsonb_array_length(StyleFeedback.not_understood) > 0)
            .order_by(StyleFeedback.id.desc())
            .limit(limit)
        )
        return [
            Unread(feedback=f.feedback, clauses=list(f.not_understood), at=f.created_at) for f in session.scalars(stmt)
        ]


def learn(
    settings: Settings,
    actor: Actor,
    items: Sequence[StyleItem],
    *,
    feedback: str,
    source: str,
    not_understood: Sequence[str],
) -> Changed:
    """Store a reading of `feedback` by `source` (studio | model): each item replaces every earlier one about
    the same thing (a later "no purple" turns "purple" round); within the reading a ruled-out item wins over
    a liked one it covers. The feedback is kept with what was not understood."""

    def operate(rows: list[StyleItemRow], at: datetime) -> tuple[list[StyleItemRow], list[dict[str, str]]]:
        earlier = [_item(r) for r in rows]
        said = stamped(items, feedback=feedback, at=at.isoformat(timespec="seconds"))
        style, changes = Style(items=tuple(earlier)).learned(said)
        kept = {id(item): row for item, row in zip(earlier, rows, strict=True)}
        order, fresh = [], []
        for item in style.items:
            if id(item) in kept:
                order.append(kept[id(item)])
                continue
            same = [row for old, row in zip(earlier, rows, strict=True) if old.same_thing(item) and row not in fresh]
            row = same[0] if same else StyleItemRow(user_name=actor.user, history=[])
            for extra in same[1:]:
                row.history = [*row.history, *extra.history, _stamp(extra, at)]
            _set(row, item, source=source, feedback=feedback, at=at)
            order.append(row)
            fresh.append(row)
        rows[:] = order
        return fresh, changes

    with session_scope(settings) as session:
        session.add(
            StyleFeedback(user_name=actor.user, feedback=feedback, reader=source, not_understood=list(not_understood))
        )
    if not items:
        return Changed(entries=[], turned=[], block=blocks.read(settings, actor, "user_style"))
    return _change(settings, actor, operate, by=f"director ({source})")


def give(settings: Settings, actor: Actor, words: str, *, liked: bool) -> Changed:
    """Store an item exactly as the user gives it (`mas style --like` / `--avoid`): no reading. It replaces an
    item about the same thing; one it turns round is a correction, with its history."""
    check_storable(words, "the item")
    words = " ".join(words.split()).lower()
    if not normalized(words):
        raise InvalidInput('name what you like or rule out in a few words, e.g. "handheld camera"')
    if len(words) > WORDS_MAX_CHARS:
        raise InvalidInput(f"an item is a few words (at most {WORDS_MAX_CHARS} characters); give one at a time")
    item = StyleItem(aspect=aspect_of(words), words=words, liked=liked)

    def operate(rows: list[StyleItemRow], at: datetime) -> tuple[list[StyleItemRow], list[dict[str, str]]]:
        same = [r for r in rows if _item(r).same_thing(item)]
        row = same[0] if same else StyleItemRow(user_name=actor.user, history=[])
        for extra in same[1:]:
            rows.remove(extra)
        source = "correction" if same and row.polarity != ("liked" if liked else "ruled_out") else "user"
        turned = _set(row, item, source=source, feedback=SOURCES[source], at=at)
        if row not in rows:
            rows.append(row)
        return [row], [turned] if turned else []

    return _change(settings, actor, operate, by="user")


def flip(settings: Settings, actor: Actor, item_id: int) -> Changed:
    """Turn one item round (liked <-> ruled out): a correction, its reading kept in its history."""

    def operate(rows: list[StyleItemRow], at: datetime) -> tuple[list[StyleItemRow], list[dict[str, str]]]:
        row = _find(rows, item_id)
        item = StyleItem(aspect=row.aspect, words=row.words, liked=row.polarity != "liked")
        turned = _set(row, item, source="correction", feedback=SOURCES["correction"], at=at)
        return [row], [turned] if turned else []

    return _change(settings, actor, operate, by="user")


def forget(settings: Settings, actor: Actor, which: int | str) -> Entry:
    """Remove one item, by its id or its words (the block's history keeps that it was there)."""
    gone: list[Entry] = []

    def operate(rows: list[StyleItemRow], at: datetime) -> tuple[list[StyleItemRow], list[dict[str, str]]]:  # noqa: ARG001
        row = _find(rows, which)
        rows.remove(row)
        gone.append(Entry.of(row))
        return [], []

    _change(settings, actor, operate, by="user")
    return gone[0]


def _find(rows: list[StyleItemRow], which: int | str) -> StyleItemRow:
    if isinstance(which, int):
        found = next((r for r in rows if r.id == which), None)
    else:
        key = normalized(which) or which.strip().lower()
        found = next((r for r in rows if _item(r).key == key), None)
    if found is None:
        named = f"item {which}" if isinstance(which, int) else repr(which)
        raise UnknownItem(f"the style has no {named}; nothing changed (`mas style show` lists the items)")
    return found


def applied(block: dict[str, Any]) -> dict[str, list[dict[str, str]]]:
    """The style a batch's plan applies, from the `user_style` block it is planned with."""
    style = Style.of(block)
    return {
        key: [{"words": i.words, "aspect": i.aspect} for i in items]
        for key, items in (("liked", style.liked), ("ruled_out", style.ruled_out))
    }


def applied_text(style: dict[str, list[dict[str, str]]] | None) -> str:
    """The style a batch applies in a sentence: "likes purple (colour), dark (mood); rules out red (colour)"."""
    if style is None:
        return "not recorded (planned before the studio recorded it, or not planned yet)"
    parts = [
        verb + " " + ", ".join(f"{i['words']} ({i['aspect']})" for i in style[key])
        for verb, key in (("likes", "liked"), ("rules out", "ruled_out"))
        if style.get(key)
    ]
    return "; ".join(parts) or "none (the user has taught no style)"
