"""The user's style as items: what each is about, its words, liked or ruled out, and where it came from.

`user_style` keeps the items (ITEMS) and the changes a later feedback made to earlier ones (ITEM_HISTORY);
the seed's text fields (COLOR_PREFERENCES ... DISLIKED_ELEMENTS) are written from the items, so every agent
reads the same style. Text an operator set in those fields directly counts as items too (`Style.of`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from mas.agents import vocabulary as V

ITEMS_KEPT = 24
"""Most items a style keeps (the oldest go first); with their history they fit a core block's cap."""

HISTORY_KEPT = 12
"""Most changes of earlier items kept in the block; every change is also in the block's history."""

FEEDBACK_CHARS = 80
"""How much of the feedback an item quotes."""

FIELDS = {
    "colour": "COLOR_PREFERENCES",
    "mood": "MOOD_PREFERENCES",
    "theme": "THEME_PREFERENCES",
    "pacing": "PACING_PREFERENCES",
}
"""The seed's text field of each aspect that has one ("other" items are kept in ITEMS only)."""


def words_of(text: str) -> list[str]:
    """Lower-case words of `text` (any script; hyphenated and apostrophe words kept whole)."""
    return re.findall(r"[^\W\d_]+(?:['’-][^\W\d_]+)*", text.lower())


def normalized(text: str) -> str:
    """An item's words as compared: lower case, without filler ("purple tones" is "purple")."""
    kept = [w for w in words_of(text) if w not in V.FILLER and w not in V.STOP_WORDS]
    return " ".join(kept)


def colour_words(text: str) -> list[str]:
    """The colour words of `text`, hyphenated compounds opened (blood-red: red; blue-green: blue, green)."""
    return [p for w in words_of(text) for p in dict.fromkeys([w, *w.split("-")]) if p in V.COLOR_FAMILIES]


def colour_families(text: str) -> set[str]:
    """Every colour family `text` names (violet: purple; teal: cyan, blue, green)."""
    return {f for c in colour_words(text) for f in V.COLOR_FAMILIES[c]}


def covers(general: str, specific: str) -> bool:
    """Whether ruling out the colour `general` rules out `specific`: the same word, or a family's name and a
    shade of it (red covers crimson; crimson does not cover red; coral, also a thing, is named only as
    itself), or a word for the family's own colour (gold covers golden and gilded)."""
    if general == specific:
        return True
    if general not in V.BASIC_COLOURS or specific in V.DUAL_USE:
        return False
    shade = V.COLOR_FAMILIES[specific]
    return shade[0] == general or shade == V.COLOR_FAMILIES.get(general)


def same_colour(a: str, b: str) -> bool:
    """Two colour words for one colour: the same word, or a family's name and a shade whose own family it is
    (purple and violet, red and crimson; not navy and teal, not emerald and lime)."""
    return (
        a == b
        or (a in V.BASIC_COLOURS and V.COLOR_FAMILIES[b][0] == a)
        or (b in V.BASIC_COLOURS and V.COLOR_FAMILIES[a][0] == b)
    )


def aspect_of(text: str) -> str:
    """What an item of free text is about, for text that came without one (the seed's fields)."""
    said = words_of(text)
    if colour_families(text):
        return "colour"
    for aspect, known in (("mood", V.MOODS), ("pacing", V.PACING), ("theme", V.THEMES)):
        if any(w in known for w in said):
            return aspect
    return "other"


@dataclass(frozen=True, kw_only=True)
class StyleItem:
    """One preference: its aspect, its words, liked or ruled out, the feedback it came from and when."""

    aspect: str
    words: str
    liked: bool
    feedback: str = ""
    at: str = ""

    @property
    def key(self) -> str:
        return normalized(self.words) or self.words.strip().lower()

    def same_thing(self, other: StyleItem) -> bool:
        """The same preference: the same words, or colours of one family (violet and purple)."""
        if self.key == other.key:
            return True
        mine, theirs = colour_words(self.words), colour_words(other.words)
        return bool(mine and theirs) and all(any(same_colour(a, b) for b in theirs) for a in mine)

    def rules_out(self, other: StyleItem) -> bool:
        """Whether this item, ruled out, rules `other` out too: the same words, or a colour it covers
        ("no red" rules out crimson; "blue, but not navy" keeps blue)."""
        if self.key == other.key:
            return True
        mine, theirs = colour_words(self.words), colour_words(other.words)
        return bool(mine and theirs) and all(any(covers(a, b) for a in mine) for b in theirs)

    def contradicts(self, other: StyleItem) -> bool:
        """The two say opposite things: one liked, the other ruled out, about the same thing (the same
        words, or a colour the ruled-out one covers)."""
        if self.liked == other.liked:
            return False
        ruled, liked = (self, other) if other.liked else (other, self)
        return ruled.rules_out(liked)

    def as_json(self) -> dict[str, str]:
        return {
            "aspect": self.aspect,
            "words": self.words,
            "polarity": "liked" if self.liked else "ruled_out",
            "feedback": self.feedback[:FEEDBACK_CHARS],
            "at": self.at,
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> StyleItem:
        return cls(
            aspect=str(value.get("aspect") or "other"),
            words=str(value.get("words") or ""),
            liked=value.get("polarity") != "ruled_out",
            feedback=str(value.get("feedback") or ""),
            at=str(value.get("at") or ""),
        )


def _split(value: Any) -> list[str]:
    items = value if isinstance(value, list) else re.split(r",|\band\b", str(value or ""))
    return [str(i).strip() for i in items if normalized(str(i))]


@dataclass(frozen=True, kw_only=True)
class Style:
    """A user's style: the items, liked and ruled out."""

    items: tuple[StyleItem, ...] = ()

    @classmethod
    def of(cls, user_style: dict[str, Any]) -> Style:
        """The style a `user_style` block holds: its items, and the seed's fields' text an operator set
        that no item covers (liked, or ruled out for DISLIKED_ELEMENTS)."""
        items = [StyleItem.from_json(i) for i in user_style.get("ITEMS") or [] if isinstance(i, dict)]
        keys = {i.key for i in items}
        for aspect, field in FIELDS.items():
            for text in _split(user_style.get(field)):
                if normalized(text) not in keys:
                    items.append(StyleItem(aspect=aspect, words=text, liked=True, feedback="set in the block"))
                    keys.add(normalized(text))
        for text in _split(user_style.get("DISLIKED_ELEMENTS")):
            if normalized(text) not in keys:
                items.append(StyleItem(aspect=aspect_of(text), words=text, liked=False, feedback="set in the block"))
                keys.add(normalized(text))
        return cls(items=tuple(items))

    @property
    def liked(self) -> list[StyleItem]:
        return [i for i in self.items if i.liked]

    @property
    def ruled_out(self) -> list[StyleItem]:
        return [i for i in self.items if not i.liked]

    def learned(self, reading: Sequence[StyleItem]) -> tuple[Style, list[dict[str, str]]]:
        """This style after a new reading, and what the reading changed of earlier items. A new item
        replaces every earlier one about the same thing (a later "no purple" removes "purple"); within one
        reading a ruled-out item wins over a liked one of the same words, and a liked shade beside its
        ruled-out family is the user's exception ("no yellow, but gold")."""
        new = [i for i in reading if not i.liked or not any(o.key == i.key for o in reading if not o.liked)]
        changes = []
        kept = []
        for old in self.items:
            later = next((i for i in new if i.same_thing(old)), None)
            if later is None:
                kept.append(old)
            elif later.liked != old.liked:
                changes.append(
                    {
                        "words": old.words,
                        "was": "liked" if old.liked else "ruled_out",
                        "now": f"{'liked' if later.liked else 'ruled_out'}: {later.words}",
                        "feedback": later.feedback[:FEEDBACK_CHARS],
                        "at": later.at,
                    }
                )
        return Style(items=tuple([*kept, *new][-ITEMS_KEPT:])), changes

    def block_fields(self, history: Sequence[dict[str, str]] = ()) -> dict[str, Any]:
        """The `user_style` fields this style writes: the items, their history and the seed's fields."""
        fields: dict[str, Any] = {
            field: ", ".join(dict.fromkeys(i.words for i in self.liked if i.aspect == aspect))
            for aspect, field in FIELDS.items()
        }
        fields["DISLIKED_ELEMENTS"] = list(dict.fromkeys(i.words for i in self.ruled_out))
        fields["ITEMS"] = [i.as_json() for i in self.items]
        fields["ITEM_HISTORY"] = list(history)[-HISTORY_KEPT:]
        return fields

    def phrases(self, *, only: Iterable[StyleItem] | None = None) -> list[str]:
        """The liked items (those in `only` when given) in the user's own words, one phrase per aspect."""
        chosen = list(self.liked if only is None else only)
        out = []
        for aspect in V.ASPECT_NAMES:
            said = [i.words for i in chosen if i.aspect == aspect]
            if said:
                suffix = {"colour": " colours", "mood": " mood", "pacing": " pacing"}.get(aspect, "")
                out.append(", ".join(dict.fromkeys(said)) + suffix)
        return out


def stamped(items: Iterable[StyleItem], *, feedback: str, at: str) -> list[StyleItem]:
    """`items` as read from `feedback` at `at`."""
    return [replace(i, feedback=feedback[:FEEDBACK_CHARS], at=at) for i in items]
