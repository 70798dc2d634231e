"""The user's style, as the studio itself reads, checks and applies it, whatever a model says.

The seed promises that every prompt carries the learned style (colour, mood, pacing) and none of the
DISLIKED_ELEMENTS (whitepaper 3.2, 3.7: "style preference application 100 %"). A model may forget either,
so the studio checks each prompt (`check`), and repairs one that still misses after the model was asked
again (`apply`). Style feedback is read by keyword here too (`read`): what it plainly says is never lost
to a model's extraction.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from mas.agents.roles import StylePreferences
from mas.palette import COLORS, COOL, WARM

MOODS = {
    "dark": "bright",
    "moody": "cheerful",
    "bright": "dark",
    "cheerful": "gloomy",
    "serene": "chaotic",
    "calm": "frantic",
    "mysterious": "plain",
    "epic": "mundane",
    "dreamy": "harsh",
    "gritty": "polished",
    "whimsical": "grim",
    "melancholic": "upbeat",
    "energetic": "sluggish",
    "gloomy": "cheerful",
}
"""Moods the reader knows, each with its opposite (what a user who likes it dislikes)."""

PACING = {"slow": "fast cuts", "fast": "slow lingering shots", "dynamic": "static shots", "lingering": "fast cuts"}
"""Pacing words, each with its opposite."""

THEMES = ["fantasy", "mythical", "sci-fi", "nature", "urban", "cosmic", "underwater", "gothic", "retro"]

STOP_WORDS = frozenset(
    "a an and or the of with in on at to for by from into as is are be its it this that these those "
    "tones tone aesthetics aesthetic shots shot cuts lighting colors colours color colour style".split()
)
"""Words that say nothing on their own: never required of a prompt, never banned from one."""

ASPECTS = (
    ("COLOR_PREFERENCES", "colour palette of {}"),
    ("MOOD_PREFERENCES", "{} atmosphere and lighting"),
    ("PACING_PREFERENCES", "{} pacing"),
)
"""The preferences every prompt must carry, and how the studio words one that is missing."""


def words(text: str) -> list[str]:
    """Lower-case words of `text` (hyphenated words kept whole)."""
    return re.findall(r"[a-z][a-z-]*", text.lower())


def content_words(text: str) -> list[str]:
    return [w for w in words(text) if w not in STOP_WORDS and len(w) > 1]


def has_word(text_words: set[str], word: str) -> bool:
    """`word` in the text, allowing a plural or a hyphenated compound (blue-ish, purples)."""
    return any(t == word or t == word + "s" or t.startswith(word + "-") or t.endswith("-" + word) for t in text_words)


def mentions(text_words: set[str], word: str) -> bool:
    """`word` in the text as `has_word` finds it, or, for a word of five letters or more, by its first five
    letters (guardians in "guardian", phoenix in "phoenixes")."""
    return has_word(text_words, word) or (len(word) >= 5 and any(t.startswith(word[:5]) for t in text_words))


@dataclass(frozen=True, kw_only=True)
class StyleCheck:
    """How one prompt stands against the user's style: what it misses and what it should not name."""

    missing: list[str] = field(default_factory=list)  # preferences absent, e.g. ["purple", "slow"]
    disliked: list[str] = field(default_factory=list)  # disliked words present, e.g. ["bright"]

    @property
    def applied(self) -> bool:
        return not self.missing and not self.disliked

    def problems(self) -> list[str]:
        """What is wrong, in words a model (or a person) can act on."""
        out = []
        if self.missing:
            out.append(f"the prompt must name the user's preferences: {', '.join(self.missing)}")
        if self.disliked:
            out.append(f"the prompt must not name what the user dislikes: {', '.join(self.disliked)}")
        return out

    def as_json(self) -> dict[str, Any]:
        return {"applied": self.applied, "missing": self.missing, "disliked": self.disliked}


def preferences(user_style: dict[str, Any], key: str) -> list[str]:
    """The items of one preference (comma-separated text, or a list) that carry a content word."""
    value = user_style.get(key) or ""
    items = value if isinstance(value, list) else re.split(r",|\band\b", str(value))
    return [i.strip() for i in items if content_words(str(i))]


def banned_words(user_style: dict[str, Any]) -> set[str]:
    """The words of DISLIKED_ELEMENTS a prompt must not name (none the user also prefers)."""
    liked = {w for key, _ in ASPECTS for item in preferences(user_style, key) for w in content_words(item)}
    disliked = {w for d in user_style.get("DISLIKED_ELEMENTS") or [] for w in content_words(str(d))}
    return disliked - liked


def check(prompt: str, user_style: dict[str, Any]) -> StyleCheck:
    """Which preferences `prompt` misses (an item is carried when all its words are) and which disliked
    words it names."""
    present = set(words(prompt))
    missing = [
        item
        for key, _ in ASPECTS
        for item in preferences(user_style, key)
        if not all(has_word(present, w) for w in content_words(item))
    ]
    disliked = sorted(w for w in banned_words(user_style) if has_word(present, w))
    return StyleCheck(missing=missing, disliked=disliked)


def remove_words(prompt: str, banned: set[str]) -> str:
    """`prompt` without the banned words (and the commas they leave behind)."""
    if not banned:
        return prompt
    pattern = r"\b(" + "|".join(map(re.escape, sorted(banned, key=len, reverse=True))) + r")(s|-\w+)?\b\s*"
    prompt = re.sub(pattern, "", prompt, flags=re.I)
    return re.sub(r"\s+,", ",", re.sub(r"(,\s*)+,", ",", prompt)).strip(" ,")


def phrases(user_style: dict[str, Any], *, only: list[str] | None = None) -> list[str]:
    """The studio's words for the style's colour, mood and pacing (only the items in `only` when given)."""
    out = []
    for key, template in ASPECTS:
        items = [i for i in preferences(user_style, key) if only is None or i in only]
        if items:
            out.append(template.format(", ".join(items)))
    return out


def apply(prompt: str, user_style: dict[str, Any]) -> str:
    """`prompt` repaired: disliked words removed, missing preferences added in the studio's words."""
    prompt = remove_words(prompt, banned_words(user_style))
    missing = check(prompt, user_style).missing
    return ", ".join(p for p in [prompt.rstrip(". "), *phrases(user_style, only=missing)] if p)


def read(feedback: str) -> StylePreferences:
    """The studio's own reading of style feedback: the colours, moods, themes and pacing it names, and their
    opposites as what the user dislikes."""
    said = words(feedback)
    colors = [w for w in said if w in COLORS]
    moods = [w for w in said if w in MOODS]
    pacing = [w for w in said if w in PACING]
    themes = [w for w in said if w in THEMES]
    disliked = [f"{MOODS[m]} aesthetics" for m in moods] + [f"{PACING[p]}" for p in pacing]
    if colors and all(c in COOL for c in colors):
        disliked.append("warm orange and yellow tones")
    elif colors and all(c in WARM for c in colors):
        disliked.append("cold blue tones")
    return StylePreferences(
        colors=", ".join(dict.fromkeys(colors)),
        moods=", ".join(dict.fromkeys(moods)),
        themes=", ".join(dict.fromkeys(themes)),
        pacing=", ".join(dict.fromkeys(pacing)),
        disliked=disliked,
    )
