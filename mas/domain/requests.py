"""A production request, typed: what the CLI hands the Director and what a batch or a schedule stores.

`ProductionRequest` is the one form of a request; it is stored as JSON (`to_json` / `from_json`), so nothing
is read back from English. Free text ("Create 10 videos of mythical creatures") is read by `parse_request`,
rule-based and deterministic: it understands a count (digits or number words, "a video" = 1), a theme
(after "of" / "about" / "featuring", or a quoted phrase) and the kind of work (a batch, an N-part series,
N variations for an A/B test). What it can't read comes back as a question, and nothing is queued.
`mas series` and `mas ab` build their request from its parts (`ProductionRequest.series`, `.ab`).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

from mas.config import Settings
from mas.errors import InvalidInput
from mas.text import check_storable

NUMBER_WORDS = {
    "a": 1,
    "an": 1,
    "one": 1,
    "single": 1,
    "two": 2,
    "pair": 2,
    "couple": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
    "fifteen": 15,
    "twenty": 20,
    "dozen": 12,
}
_COUNT = r"(?P<count>-?\d+|" + "|".join(sorted(NUMBER_WORDS, key=len, reverse=True)) + r")"
_UNIT = r"(?:videos?|clips?|shorts?|films?|shots?|scenes?)"
_SERIES = re.compile(_COUNT + r"[\s-]*(?:part|episode)s?\b\s*(?P<name>.*?)\s*series\b", re.I)
_VARIATIONS = re.compile(_COUNT + r"\s+(?:variations?|versions?|variants?)\b", re.I)
_BATCH = re.compile(_COUNT + r"\s+(?:\w+\s+){0,3}?" + _UNIT + r"\b", re.I)
_THEME = re.compile(r"\b(?:of|about|featuring|showing|with)\s+(?P<theme>.+)$", re.I)


MAX_VARIATIONS = 26
"""Variations of one A/B test: one label per letter, A to Z."""

MAX_SERIES_NAME = 200
"""Longest series name: what the series table stores."""

RequestKind = Literal["batch", "series", "ab"]
"""What a request makes: a batch of videos, episodes of a series, or variations for an A/B test."""

KINDS: tuple[RequestKind, ...] = get_args(RequestKind)

_FIELDS: dict[str, type | tuple[type, ...]] = {
    "kind": str,
    "count": int,
    "theme": str,
    "series_name": (str, type(None)),
    "text": str,
}
"""Each field of a stored request and the JSON types it may have."""


class RequestError(InvalidInput):
    """The request can't be queued; the message is a question or instruction for the user."""


@dataclass(frozen=True, kw_only=True)
class ProductionRequest:
    """What to make. Every instance holds the limits that need no settings (checked on creation); the
    constructors that take settings check the configured ones too.

    `text` is what the user typed, or a description when the request was built from its parts; it is shown,
    never parsed again. `series_name` is set for a series and only for one."""

    kind: RequestKind
    count: int
    theme: str
    series_name: str | None = None
    text: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise RequestError(f"unknown kind of request {self.kind!r}; use one of {', '.join(KINDS)}")
        if self.count < 1:
            raise RequestError(f"the count must be at least 1, got {self.count}")
        if self.kind == "ab" and self.count < 2:
            raise RequestError("an A/B test needs at least 2 variations")
        if self.kind == "ab" and self.count > MAX_VARIATIONS:
            raise RequestError(
                f"an A/B test has at most {MAX_VARIATIONS} variations (labelled A to Z), got {self.count}"
            )
        if not self.theme:
            raise RequestError(f'{self.count} video(s) of what? Add a theme, e.g. "... of mythical creatures"')
        if (self.kind == "series") != bool(self.series_name):
            raise RequestError("a series request needs a series name, and only a series request has one")
        if self.series_name and len(self.series_name) > MAX_SERIES_NAME:
            raise RequestError(
                f"the series name is {len(self.series_name)} characters long; the limit is {MAX_SERIES_NAME}"
            )
        _check_storable([self.text, self.theme, self.series_name], "the request")

    @classmethod
    def series(cls, name: str, *, episodes: int, settings: Settings) -> ProductionRequest:
        """`episodes` more episodes of the series `name`, taken whole as the user gave it."""
        name = _part(name, "the series name", settings)
        _check_count(episodes, settings)
        return cls(
            kind="series",
            count=episodes,
            theme=name,
            series_name=name,
            text=f'Create {episodes} episode(s) of the series "{name}"',
        )

    @classmethod
    def batch(cls, theme: str, *, count: int, settings: Settings) -> ProductionRequest:
        """`count` videos of `theme`, taken whole as the user gave it (the API's typed request)."""
        theme = _part(theme, "the theme", settings)
        _check_count(count, settings)
        return cls(kind="batch", count=count, theme=theme, text=f"Create {count} video(s) of {theme}")

    @classmethod
    def ab(cls, concept: str, *, variations: int, settings: Settings) -> ProductionRequest:
        """An A/B test of `variations` variations of `concept`, taken whole as the user gave it."""
        concept = _part(concept, "the concept", settings)
        _check_count(variations, settings)
        return cls(kind="ab", count=variations, theme=concept, text=f'Generate {variations} variations of "{concept}"')

    def to_json(self) -> dict[str, Any]:
        """The request as stored (a batch's or a schedule's `spec`)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: object) -> ProductionRequest:
        """A stored request back; a field that is missing, unknown or of the wrong type raises RequestError."""
        if not isinstance(data, dict):
            raise RequestError(f"a stored request must be a JSON object, got {type(data).__name__}")
        if missing := _FIELDS.keys() - data.keys():
            raise RequestError(f"the stored request has no {', '.join(sorted(missing))}")
        if unknown := data.keys() - _FIELDS.keys():
            raise RequestError(f"the stored request has unknown fields: {', '.join(sorted(map(str, unknown)))}")
        for name, types in _FIELDS.items():
            if isinstance(data[name], bool) or not isinstance(data[name], types):
                raise RequestError(f"the stored request's {name} is {data[name]!r}, of the wrong type")
        return cls(**data)


def _check_storable(value: object, what: str) -> None:
    """`mas.text.check_storable`, raising a RequestError like every other refusal of a request."""
    try:
        check_storable(value, what)
    except InvalidInput as exc:
        raise RequestError(str(exc)) from None


def _check_length(text: str, what: str, settings: Settings) -> None:
    if len(text) > settings.service.max_request_chars:
        raise RequestError(f"{what} is {len(text)} characters long; the limit is {settings.service.max_request_chars}")
    _check_storable(text, what)


def _part(value: str, what: str, settings: Settings) -> str:
    """One part of a request built from its parts (a series name, a concept), stripped and checked."""
    value = (value or "").strip()
    if not value:
        raise RequestError(f"{what} is empty")
    _check_length(value, what, settings)
    return value


def _check_count(count: int, settings: Settings) -> None:
    """The configured limit on videos per request (the others hold for every request)."""
    if count > settings.service.max_batch_videos:
        raise RequestError(
            f"{count} videos is above the limit of {settings.service.max_batch_videos} per request "
            "(MAS_MAX_BATCH_VIDEOS); split it or raise the limit"
        )


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
        raise RequestError('the request is empty: say what to make, e.g. "Create 3 videos of dragons"')
    _check_length(text, "the request", settings)
    # a quoted concept runs from the first opening quote to the last closing one (quotes inside it stay),
    # and only the words outside it say what kind of work this is
    quoted = re.search(r"[\"“](.+)[\"”]", text)
    outside = text[: quoted.start()] + "\x00" + text[quoted.end() :] if quoted else text
    patterns: tuple[tuple[RequestKind, re.Pattern[str]], ...] = (
        ("series", _SERIES),
        ("ab", _VARIATIONS),
        ("batch", _BATCH),
    )
    found = [(m.start(), kind, m) for kind, pattern in patterns if (m := pattern.search(outside))]
    kind: RequestKind
    name: str | None = None
    if found:
        _, kind, m = min(found, key=lambda f: f[0])  # the first one the request says
        count = _count(m["count"])
        if kind == "series":
            name = _clean_theme(m["name"].replace("\x00", quoted[0]) if quoted else m["name"]) or None
            theme = name or ""
        else:
            after = outside[m.end() :]
            t = _THEME.search(after)
            fallback = after if kind == "ab" else ""
            theme = quoted[1].strip() if quoted else _clean_theme(t["theme"] if t else fallback)
    else:
        t = _THEME.search(text)
        if t is None and quoted is None:
            raise RequestError(
                'I can\'t tell how many videos or of what: try "Create 5 videos of <theme>", '
                '"Create a 3-part <name> series" or "Generate 3 variations of <concept>"'
            )
        count, kind = 1, "batch"
        theme = quoted[1].strip() if quoted else _clean_theme(t["theme"] if t else "")
    _check_count(count, settings)
    return ProductionRequest(text=text, kind=kind, count=count, theme=theme, series_name=name)
