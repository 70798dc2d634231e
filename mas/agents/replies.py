"""The replies agents must give, as pydantic models every model-backed backend validates against.

Models send lists where text is wanted and one text where a list is wanted; the field types below accept
both, so only replies that cannot mean what was asked fail. The same models give the JSON schema a
structured-output endpoint constrains decoding with.
"""

from __future__ import annotations

import html
import json
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from mas.agents import vocabulary as V
from mas.errors import StudioError


class NoValidReply(StudioError):
    """A model was asked, shown its mistakes and asked again, and never gave a valid reply: the roles fall
    back to the studio's own rule where they have one (`mas.agents.asking`)."""


VALUE_EXCERPT_CHARS = 120
"""How much of a wrong value a validation problem quotes."""

_FENCE = re.compile(r"^```[a-zA-Z]*\s*|\s*```$")


def _as_text(value: Any) -> Any:
    """Text as the model meant it: a list of words joined, HTML entities it wrote (&#34;) read back."""
    if value is None:
        return ""
    if isinstance(value, list) and all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value):
        return ", ".join(str(v) for v in value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return html.unescape(value).strip() if isinstance(value, str) else value


def _as_texts(value: Any) -> Any:
    if value is None:
        return []
    if isinstance(value, str):
        return [value.strip()] if value.strip() else []
    if isinstance(value, list):
        return [
            str(v).strip() if isinstance(v, (int, float)) and not isinstance(v, bool) else _as_text(v)
            for v in value
            if not (isinstance(v, str) and not v.strip())
        ]
    return value


TEXT_MAX_CHARS = 600
"""Longest text field (a concept, a reason); bounds also what a schema-constrained model may ramble."""

PROMPT_MAX_CHARS = 1500
"""Longest prompt for the video model."""

LIST_MAX_ITEMS = 10
"""Most entries of a list field (rules, reasons, learnings)."""

Text = Annotated[Annotated[str, StringConstraints(max_length=TEXT_MAX_CHARS)], BeforeValidator(_as_text)]
"""Text; a list of words becomes one comma-separated text."""

RequiredText = Annotated[
    Annotated[str, StringConstraints(min_length=1, max_length=TEXT_MAX_CHARS)], BeforeValidator(_as_text)
]
"""Text that must not be empty."""

PromptText = Annotated[
    Annotated[str, StringConstraints(min_length=1, max_length=PROMPT_MAX_CHARS)], BeforeValidator(_as_text)
]
"""A prompt for the video model."""

Texts = Annotated[
    Annotated[list[Annotated[str, StringConstraints(max_length=TEXT_MAX_CHARS)]], Field(max_length=LIST_MAX_ITEMS)],
    BeforeValidator(_as_texts),
]
"""A list of texts; one text becomes a list of one."""


def _exactly(items: list, info: ValidationInfo, what: str) -> list:
    """As many items as the validation context's `count` asks for (any number without one)."""
    wanted = (info.context or {}).get("count")
    if wanted is not None and len(items) != wanted:
        raise ValueError(f"{len(items)} {what} where exactly {wanted} were asked")
    return items


class Reply(BaseModel):
    """A reply: unknown fields are ignored, known ones must have their type."""

    model_config = ConfigDict(extra="ignore")


class PlannedVideoReply(Reply):
    concept: RequiredText
    approach: Text = ""


class PlanReply(Reply):
    """`plan`: the Director's videos (exactly as many as asked: validation context `count`)."""

    videos: list[PlannedVideoReply]
    series_style: Text = ""
    consistency_rules: Texts = []
    series_elements: Texts = []

    _count = field_validator("videos")(lambda items, info: _exactly(items, info, "videos"))


def _as_items(value: Any) -> Any:
    """A list of items; a bare word is an item of unknown aspect, a dict of aspect -> words is unrolled."""
    if value is None or value == "":
        return []
    if isinstance(value, dict):
        return [{"aspect": k, "words": w} for k, ws in value.items() for w in (ws if isinstance(ws, list) else [ws])]
    if isinstance(value, (str, dict)):
        value = [value]
    if isinstance(value, list):
        return [{"aspect": "", "words": v} if isinstance(v, str) else v for v in value if v not in ("", None)]
    return value


class StyleItemReply(Reply):
    """One preference a model read: its aspect and its words."""

    aspect: Annotated[
        str, BeforeValidator(lambda v: V.ASPECT_ALIASES.get(str(v).strip().lower(), str(v).strip().lower()))
    ] = ""
    words: RequiredText


Items = Annotated[list[StyleItemReply], Field(max_length=LIST_MAX_ITEMS), BeforeValidator(_as_items)]


class CheckedReply(Reply):
    """A reply the studio also checks for what it can measure: a `check` in the question's context, run as
    validation, whose problems are shown to the model when it is asked again."""

    @model_validator(mode="after")
    def _sensible(self, info: ValidationInfo) -> CheckedReply:
        check = (info.context or {}).get("check")
        if check is not None:
            problems = check(self)
            if problems:
                raise ValueError("; ".join(problems))
        return self


class StyleReply(CheckedReply):
    """`read_style`: what the feedback likes and what it rules out, item by item. The studio's checks of
    a reading (`mas.agents.reading`) run as validation, with the feedback in the context."""

    liked: Items = []
    ruled_out: Items = []

    @model_validator(mode="before")
    @classmethod
    def _shaped(cls, value: Any) -> Any:
        """A reply with neither list is another shape ({"colors": ..., "moods": ...}), not an empty reading."""
        if isinstance(value, dict) and not {"liked", "ruled_out"} & set(value):
            raise ValueError('the reply must have "liked" and "ruled_out" lists (empty when the feedback names none)')
        return value


class PromptStyleReply(CheckedReply):
    """`check_style`: which ruled-out items a prompt shows and which liked ones it misses, each named as the
    question listed it (validation context `liked`, `ruled_out`: the lists asked about)."""

    shows_ruled_out: Texts = []
    misses_liked: Texts = []

    @model_validator(mode="after")
    def _listed(self, info: ValidationInfo) -> PromptStyleReply:
        context = info.context or {}
        for field_name, key in (("shows_ruled_out", "ruled_out"), ("misses_liked", "liked")):
            listed = context.get(key)
            unknown = [t for t in getattr(self, field_name) if listed is not None and t.strip().lower() not in listed]
            if unknown:
                raise ValueError(f"{field_name}: {unknown} are not in {key}; name items only as {key} lists them")
        return self


class EnglishReply(CheckedReply):
    """`translate`: the feedback in English, checked to be English the studio reads."""

    english: RequiredText


class DraftReply(Reply):
    """`write`: one prompt for the video model."""

    prompt: PromptText
    negative_prompt: Text = ""


class CandidatesReply(Reply):
    """`write` with several candidates (validation context `count`): the studio picks one."""

    candidates: list[DraftReply] = Field(min_length=1)

    _count = field_validator("candidates")(lambda items, info: _exactly(items, info, "candidates"))


class VerdictReply(Reply):
    """`review`: the Cameraman's decision."""

    action: Annotated[
        Literal["accept", "refine", "fail"], BeforeValidator(lambda v: v.strip().lower() if isinstance(v, str) else v)
    ]
    failure_reasons: Texts = []
    strategy: Text = ""


class ConsolidationReply(Reply):
    """`consolidate`: what happened and what to remember."""

    summary: RequiredText
    learnings: Texts = []


def problem(error: ValidationError) -> str:
    """A validation error in one line a person (or a model asked to correct itself) can act on."""
    parts = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "the reply"
        value = item.get("input")
        shown = "" if item["type"] == "missing" else f" (got {json.dumps(value, default=str)[:VALUE_EXCERPT_CHARS]})"
        parts.append(f"{where}: {item['msg']}{shown}")
    return "; ".join(parts)


def parse_json_object(text: str) -> dict[str, Any] | None:
    """The JSON object in `text`: the whole text, a fenced block, or the first object embedded in prose."""
    text = text.strip()
    for candidate in (text, _FENCE.sub("", text).strip()):
        try:
            value = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
        if isinstance(value, str) and value.strip().startswith("{"):  # double-encoded
            inner = parse_json_object(value)
            if inner is not None:
                return inner
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return None
