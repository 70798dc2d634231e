"""Reading a production request ("Create 10 videos of mythical creatures") into a typed plan.

Rule-based and deterministic: it understands a count (digits or number words, "a video" = 1), a theme
(after "of" / "about" / "featuring", or a quoted phrase) and the kind of work (a batch, an N-part series,
N variations for an A/B test). What it can't read comes back as a question, and nothing is queued.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mas.config import Settings
from mas.errors import InvalidInput
from mas.text import check_storable

NUMBER_WORDS = {
    "a": 1, "an": 1, "one": 1, "single": 1, "two": 2, "pair": 2, "couple": 2, "three": 3, "four": 4,
    "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12,
    "fifteen": 15, "twenty": 20, "dozen": 12,
}
_COUNT = r"(?P<count>-?\d+|" + "|".join(sorted(NUMBER_WORDS, key=len, reverse=True)) + r")"
_UNIT = r"(?:videos?|clips?|shorts?|films?|shots?|scenes?)"
_SERIES = re.compile(_COUNT + r"[\s-]*(?:part|episode)s?\b\s*(?P<name>.*?)\s*series\b", re.I)
_VARIATIONS = re.compile(_COUNT + r"\s+(?:variations?|versions?|variants?)\b", re.I)
_BATCH = re.compile(_COUNT + r"\s+(?:\w+\s+){0,3}?" + _UNIT + r"\b", re.I)
_THEME = re.compile(r"\b(?:of|about|featuring|showing|with)\s+(?P<theme>.+)$", re.I)


MAX_VARIATIONS = 26
"""Variations of one A/B test: one label per letter, A to Z."""


class RequestError(InvalidInput):
    """The request can't be queued; the message is a question or instruction for the user."""


@dataclass(frozen=True, kw_only=True)
class ProductionRequest:
    text: str
    kind: str  # "batch" | "series" | "ab"
    count: int
    theme: str
    series_name: str | None = None


def _count(word: str) -> int:
    word = word.lower()
    return int(word) if re.fullmatch(r"-?\d+", word) else NUMBER_WORDS[word]


def _clean_theme(theme: str) -> str:
    theme = re.sub(r"^(?:this concept:?|the concept:?)\s*", "", theme.strip(), flags=re.I)
    return theme.strip(" .!?\"'“”:")


def parse_request(text: str, settings: Settings) -> ProductionRequest:
    """Read `text` into a ProductionRequest, or raise RequestError saying what is missing."""
    text = (text or "").strip()
    if not text:
        raise RequestError("the request is empty: say what to make, e.g. \"Create 3 videos of dragons\"")
    if len(text) > settings.max_request_chars:
        raise RequestError(
            f"the request is {len(text)} characters long; the limit is {settings.max_request_chars}"
        )
    check_storable(text, "the request")
    # a quoted concept runs from the first opening quote to the last closing one (quotes inside it stay),
    # and only the words outside it say what kind of work this is
    quoted = re.search(r"[\"“](.+)[\"”]", text)
    outside = text[: quoted.start()] + "\x00" + text[quoted.end():] if quoted else text
    found = [(m.start(), kind, m) for kind, pattern in (("series", _SERIES), ("ab", _VARIATIONS), ("batch", _BATCH))
             if (m := pattern.search(outside))]
    kind = min(found, key=lambda f: f[0])[1] if found else None  # the first one the request says
    m = next((match for _, k, match in found if k == kind), None)
    if kind == "series":
        count = _count(m["count"])
        name = _clean_theme(m["name"].replace("\x00", quoted[0]) if quoted else m["name"]) or None
        theme = name or ""
    elif kind == "ab":
        count, name = _count(m["count"]), None
        after = outside[m.end():]
        t = _THEME.search(after)
        theme = quoted[1].strip() if quoted else _clean_theme(t["theme"] if t else after)
    elif kind == "batch":
        count, name = _count(m["count"]), None
        t = _THEME.search(outside[m.end():])
        theme = quoted[1].strip() if quoted else _clean_theme(t["theme"] if t else "")
    else:
        t = _THEME.search(text)
        if t is None and quoted is None:
            raise RequestError(
                "I can't tell how many videos or of what: try \"Create 5 videos of <theme>\", "
                "\"Create a 3-part <name> series\" or \"Generate 3 variations of <concept>\""
            )
        count, kind, name = 1, "batch", None
        theme = quoted[1].strip() if quoted else _clean_theme(t["theme"])
    if count < 1:
        raise RequestError(f"the count must be at least 1, got {count}")
    if count > settings.max_batch_videos:
        raise RequestError(
            f"{count} videos is above the limit of {settings.max_batch_videos} per request "
            "(MAS_MAX_BATCH_VIDEOS); split it or raise the limit"
        )
    if kind == "ab" and count < 2:
        raise RequestError("an A/B test needs at least 2 variations")
    if kind == "ab" and count > MAX_VARIATIONS:
        raise RequestError(f"an A/B test has at most {MAX_VARIATIONS} variations (labelled A to Z), got {count}")
    if not theme:
        raise RequestError(f"{count} video(s) of what? Add a theme, e.g. \"... of mythical creatures\"")
    return ProductionRequest(text=text, kind=kind, count=count, theme=theme, series_name=name)
