"""The studio's own reading of style feedback: the offline backend's reader. It never guesses a polarity.

It reads English clause by clause (`mas.agents.clauses`): "avoid any red" rules red out, "I love blue but I
can't stand yellow" likes blue and rules out yellow. It stores an item only when it accounts for the whole
clause that names it: a cue it knows that governs the item, and nothing in the clause it cannot read that
could turn the polarity round (an unknown verb or adjective, a tense shift, a comparison, a second negation,
another language). A bare list of style words ("dark moody purple tones") is liked, but only when every
clause of the feedback is understood: "Red. Can't stand it." says nothing about red the reader can see.
Everything else is *not understood*: returned to be shown to the user, never stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from mas.agents import clauses
from mas.agents import vocabulary as V
from mas.agents.style import StyleItem, words_of

_LONGEST_FIRST = sorted((tuple(p.split()) for p in V.ITEM_PHRASES), key=len, reverse=True)


@dataclass(frozen=True, kw_only=True)
class Unread:
    """A clause the reader could not account for, as the user wrote it, and what it could not read there."""

    text: str
    why: str


@dataclass(frozen=True, kw_only=True)
class Understanding:
    """What the reader understood of a feedback (items) and what it did not (clauses, quoted)."""

    items: list[StyleItem] = field(default_factory=list)
    not_understood: list[Unread] = field(default_factory=list)


def base(word: str) -> str:
    """The word the vocabulary knows for `word`: itself, its singular (golds) or the adjective of a
    comparative (darker, moodier)."""
    return next((f for f in clauses.forms(word) if _aspect(f)), word)


def _aspect(word: str) -> str | None:
    if word in V.COLOR_FAMILIES:
        return "colour"
    if word in V.MOODS:
        return "mood"
    if word in V.PACING:
        return "pacing"
    if word in V.THEMES:
        return "theme"
    return None


def style_words(text: str) -> list[str]:
    """The words of `text` the vocabulary knows as a colour, a mood, a pacing or a theme, once each."""
    return list(dict.fromkeys(w for w in words_of(text) if _aspect(base(w))))


def reads(text: str) -> bool:
    """Whether the studio reads any of `text`: a clause of English it knows (not another language or script)."""
    return any(w.readable for w in clauses.read(text))


def understand(feedback: str) -> Understanding:
    """The items `feedback` plainly says, liked or ruled out, once each (the last saying of a word wins), and
    the clauses it could not account for."""
    parsed = clauses.parse(feedback)
    unread = [c for c in parsed.clauses if not c.accounted]
    bare_ok = not unread  # a bare list is liked only where nothing else in the feedback could say otherwise
    if not bare_ok:
        unread += [
            replace(c, why="a list of style words with no wish or rule-out of its own, beside a clause not understood")
            for c in parsed.clauses
            if c.accounted
            and not c.cued
            and any(w.clause == c.number and clauses.names_item(w.text) for w in parsed.words)
        ]
    skipped = {c.number for c in unread}
    words = [w for w in parsed.words if w.clause not in skipped and not w.name and (w.governed or bare_ok)]
    found: dict[str, StyleItem] = {}
    i = 0
    while i < len(words):
        texts = [base(w.text) for w in words[i : i + 3]]
        phrase = next((p for p in _LONGEST_FIRST if tuple(texts[: len(p)]) == p), None)
        span = len(phrase) if phrase and len({w.clause for w in words[i : i + len(phrase)]}) == 1 else 1
        word = words[i]
        aspect = V.ITEM_PHRASES[" ".join(phrase)] if phrase and span == len(phrase) else _aspect(base(word.text))
        if aspect is not None:
            said = " ".join(texts[:span]) if span > 1 else base(word.text)
            found.pop(said, None)
            found[said] = StyleItem(aspect=aspect, words=said, liked=not word.ruled_out)
        i += span
    shown = sorted(unread, key=lambda c: c.start)
    return Understanding(
        items=list(found.values()),
        not_understood=[Unread(text=feedback[c.start : c.end], why=c.why) for c in shown],
    )


def read(feedback: str) -> list[StyleItem]:
    """The items `understand` finds in `feedback` (what it does not understand left out)."""
    return understand(feedback).items
