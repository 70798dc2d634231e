"""A model's reading of style feedback, checked for what the studio can measure before it is stored.

The model reads language; the studio does not pretend to. It checks a reading's structure (an aspect, a
few words that name a preference, not the task's words or markup, nothing both liked and ruled out) and,
where its own reader reads the feedback (English it knows), that each item speaks of something the feedback
says (only where it knows every word of the feedback: "something chilling" may be read as eerie), that no item has the opposite polarity of what the feedback plainly says (nor carries those words or a
colour of their family on the other side: "blue instead of red" liked whole) and that the reading speaks of
at least one thing the feedback plainly names (in its words, a synonym of its meaning groups or a colour of
its family). A reading that passes stands as the model gave it, whatever the studio's own reader would have
added; one that never passes is replaced by the studio's reading.
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
        if any(o.contradicts(liked) for o in model):
            out.append(f"{liked.words!r} is both liked and ruled out")  # noqa: PERF401
    if all(clauses.known(w) for w in words_of(feedback)):  # a word it does not know may be the item's synonym
        senses = _senses(feedback)
        out += [
            f"{'liked' if i.liked else 'ruled_out'} {i.words!r} is not in the feedback: name only what it says"
            for i in model
            if not grounded(i, feedback, senses)
        ]
    studio = style_reader.read(feedback)
    for own in studio:
        for item in model:
            if opposes(item, own, studio):
                said = "rules out" if not own.liked else "asks for"
                out.append(f"the feedback {said} {own.words!r}: it belongs in {'liked' if own.liked else 'ruled_out'}")
    if studio and not any(shares(item, own) for item in model for own in studio):
        out.append(f"the feedback names {', '.join(i.words for i in studio)}: the reading has none of it")
    return out


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


def shares(item: StyleItem, own: StyleItem) -> bool:
    """Whether the model's item speaks of something the studio read: a word in common (plural or comparative
    alike), a meaning group in common ("gloomy" read as "dark") or colours of one family ("violet" for
    "purple"). A reading that shares none of these with what the feedback plainly names is about another
    feedback ("not red." read as "tense thriller energy")."""
    mine, theirs = _senses(item.words), _senses(own.words)
    return bool(mine & theirs) or bool(colour_families(item.words) & colour_families(own.words))


def _bases(words: str) -> set[str]:
    """The words' base forms ("shots" and "shot" alike), filler aside."""
    return {style_reader.base(w) for w in normalized(words).split()} - V.STOP_WORDS


def _senses(words: str) -> set[str]:
    """The words' base forms and the meaning groups they belong to."""
    bases = _bases(words)
    return bases | {group for w in bases for group in V.MEANINGS.get(w, ())}
