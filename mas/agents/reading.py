"""A model's reading of style feedback, checked for what the studio can check without reading it.

The model reads language; the studio does not pretend to. It checks a reading's structure (an aspect, a
few words that name a preference, not the task's words or markup, nothing both liked and ruled out) and its
grounding: each item speaks of something the feedback says (or the model's English for a feedback in another
language): a word, plural or comparative alike, a meaning group or a colour family; only where the studio
knows every word of the feedback, since "something chilling" may be read as eerie. It never checks the
polarity: where its own reader reads the other way, that is recorded (`disagreements`) and the model's
reading stands. A reading that never passes is no reading: the feedback is not understood.
"""

from __future__ import annotations

import re

from mas.agents import checks, clauses, style_reader
from mas.agents import vocabulary as V
from mas.agents.replies import StyleItemReply, StyleReply
from mas.agents.style import StyleItem, aspect_of, colour_families, normalized, words_of

ITEM_MAX_WORDS = 4
"""A preference is a few words ("ocean depths", "slow lingering shots"); a longer one is the feedback
handed back."""

MARKUP = re.compile(r"[<>{}\[\]=&#_\\]|\bhttps?:")


def item_of(reply: StyleItemReply, *, liked: bool) -> StyleItem:
    """The studio's item for one of the model's, filed under colour when it names a colour."""
    aspect = "colour" if colour_families(reply.words) else reply.aspect or aspect_of(reply.words)
    return StyleItem(aspect=aspect, words=reply.words.strip().lower(), liked=liked)


def as_reply(items: list[StyleItem]) -> dict[str, list[dict[str, str]]]:
    """A reading in the `read_style` reply's shape (what a stand-in model answers)."""
    return {
        key: [{"aspect": i.aspect, "words": i.words} for i in items if i.liked == liked]
        for key, liked in (("liked", True), ("ruled_out", False))
    }


def items_of(reply: StyleReply) -> list[StyleItem]:
    return [item_of(i, liked=True) for i in reply.liked] + [item_of(i, liked=False) for i in reply.ruled_out]


def problems(reply: StyleReply, *, feedback: str, task_words: frozenset[str]) -> list[str]:
    """Why the reading cannot be stored (empty when it can), in words the model can act on."""
    out = []
    for polarity, given in (("liked", reply.liked), ("ruled_out", reply.ruled_out)):
        for raw in given:
            words = normalized(raw.words).split()
            if MARKUP.search(raw.words) or checks.MARKERS.search(raw.words):
                out.append(f"{polarity} {raw.words!r} is markup or a field name, not a preference")
            elif not words:
                out.append(f"{polarity} {raw.words!r} names no preference")
            elif len(words) > ITEM_MAX_WORDS or set(words) & (V.FEEDBACK_WORDS | V.FOREIGN_GLUE):
                out.append(f"{polarity} {raw.words!r} is the feedback's sentence; give the preference in a few words")
            elif checks.is_echo(raw.words, task_words):
                out.append(f"{polarity} {raw.words!r} repeats the task's words")
            elif raw.aspect and raw.aspect not in V.ASPECT_NAMES:
                out.append(f"{polarity} {raw.words!r}: aspect must be one of {', '.join(V.ASPECT_NAMES)}")
    if out:
        return out
    model = items_of(reply)
    for liked in (i for i in model if i.liked):
        if any(o.key == liked.key for o in model if not o.liked):
            out.append(f"{liked.words!r} is both liked and ruled out")  # noqa: PERF401
    if all(clauses.known(w) for w in words_of(feedback)):  # a word it does not know may be the item's synonym
        senses = _senses(feedback)
        out += [
            f"{'liked' if i.liked else 'ruled_out'} {i.words!r} is not in the feedback: name only what it says"
            for i in model
            if not grounded(i, feedback, senses)
        ]
    return out


def disagreements(items: list[StyleItem], feedback: str) -> list[str]:
    """Where the studio's own reader reads `feedback` the other way round from a model's items: recorded,
    never acted on (the model reads language; the studio's reader only fits the sentences it was tuned on)."""
    studio = style_reader.read(feedback)
    return [
        f"{item.words}: the model {'likes' if item.liked else 'rules out'} it, the studio's reader "
        f"{'likes' if own.liked else 'rules out'} {own.words}"
        for item in items
        for own in studio
        if opposes(item, own, studio)
    ]


def grounded(item: StyleItem, feedback: str, said: set[str]) -> bool:
    """Whether the item speaks of something in the feedback (a word, a meaning group or a colour family of
    it): a small model hands back an earlier feedback of its conversation ("fantasy stuff with lots of gold"
    for "whatever you think")."""
    mine = _senses(item.words)
    mine |= {w[:-1] for w in mine if w.endswith("s")} | {f"{w}s" for w in mine}  # "sunset" for "sunsets"
    return bool(mine & said) or bool(colour_families(item.words) & colour_families(feedback))


def opposes(item: StyleItem, own: StyleItem, studio: list[StyleItem]) -> bool:
    """Whether the model's item says the opposite of what the studio read: the same thing with the other
    polarity; an item that carries all the studio's words on the other side ("nothing dark, ever" read as
    liked "dark, ever"; "blue instead of red" liked whole, beside the studio's ruled-out "red"); or a colour
    of a family the studio reads only on the other side ("without violet" read as liked "amethyst")."""
    if item.liked == own.liked:
        return False
    theirs = _bases(own.words)
    return (
        item.contradicts(own)
        or (bool(theirs) and theirs <= _bases(item.words))
        or bool(one_sided_families(studio, liked=own.liked) & colour_families(item.words))
    )


def one_sided_families(items: list[StyleItem], *, liked: bool) -> set[str]:
    """The colour families the items name only with this polarity ("blue, but not navy" names blue on both
    sides: none)."""
    mine = {f for i in items if i.liked == liked for f in colour_families(i.words)}
    return mine - {f for i in items if i.liked != liked for f in colour_families(i.words)}


def _bases(words: str) -> set[str]:
    """The words' base forms ("shots" and "shot" alike), filler aside."""
    return {style_reader.base(w) for w in normalized(words).split()} - V.STOP_WORDS


def _senses(words: str) -> set[str]:
    """The words' base forms and the meaning groups they belong to."""
    bases = _bases(words)
    return bases | {group for w in bases for group in V.MEANINGS.get(w, ())}
