"""The studio's own reading of style feedback: the fallback when a model's reading does not validate, and
the offline backend's reader.

It reads English clause by clause (`mas.agents.clauses`): "avoid any red" rules red out, "I love blue but I
can't stand yellow" likes blue and rules out yellow. It adds nothing the user did not say (no opposites),
and says nothing about a clause it cannot read (another language) or a word it does not know.
"""

from __future__ import annotations

from mas.agents import clauses
from mas.agents import vocabulary as V
from mas.agents.style import StyleItem

PHRASES: dict[tuple[str, ...], str] = {
    tuple(phrase.split()): aspect
    for aspect, phrases in (
        ("pacing", "quick cuts|fast cuts|rapid cuts|long takes|slow motion|slow pacing|fast pacing"),
        (
            "other",
            "handheld camera|handheld|close-ups|close-up|closeups|drone shots|aerial shots|wide shots|"
            "film grain|black and white|time-lapse|timelapse|lens flares|bokeh|shaky cam|static camera|"
            "voiceover|text overlays|cartoonish characters|jump cuts",
        ),
    )
    for phrase in phrases.split("|")
}
"""Items of several words (or words that are items only as a whole) the reader knows, and their aspect."""

_LONGEST_FIRST = sorted(PHRASES, key=len, reverse=True)


def base(word: str) -> str:
    """The word the vocabulary knows for `word`: itself, its singular (golds) or the adjective of a
    comparative (darker, moodier)."""
    for form in (
        word,
        word[:-1] if word.endswith("s") else "",
        word[:-3] + "y" if word.endswith("ier") else "",
        word[:-2] if word.endswith("er") else "",
        word[:-3] if word.endswith("ter") else "",
    ):
        if form and _aspect(form, exact=True):
            return form
    return word


def _aspect(word: str, *, exact: bool = False) -> str | None:
    if not exact:
        word = base(word)
    if word in V.COLOR_FAMILIES:
        return "colour"
    if word in V.MOODS:
        return "mood"
    if word in V.PACING:
        return "pacing"
    if word in V.THEMES:
        return "theme"
    return None


def reads(text: str) -> bool:
    """Whether the studio reads any of `text`: a clause of English it knows (not another language or script)."""
    return any(w.readable for w in clauses.read(text))


def read(feedback: str) -> list[StyleItem]:
    """The items `feedback` plainly says, liked or ruled out, once each (the last saying of a word wins)."""
    words = [w for w in clauses.read(feedback) if w.readable and not w.name]
    found: dict[str, StyleItem] = {}
    i = 0
    while i < len(words):
        texts = [base(w.text) for w in words[i : i + 3]]
        phrase = next((p for p in _LONGEST_FIRST if tuple(texts[: len(p)]) == p), None)
        span = len(phrase) if phrase and len({w.clause for w in words[i : i + len(phrase)]}) == 1 else 1
        word = words[i]
        aspect = PHRASES[phrase] if phrase and span == len(phrase) else _aspect(word.text)
        if aspect is not None:
            said = " ".join(texts[:span]) if span > 1 else base(word.text)
            found.pop(said, None)
            found[said] = StyleItem(aspect=aspect, words=said, liked=not word.ruled_out)
        i += span
    return list(found.values())
