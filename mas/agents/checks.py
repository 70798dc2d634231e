"""What the studio checks in a model's words before it uses them: a prompt is a prompt, a reason a reason.

A small model answers in valid JSON that says nothing: a prompt that reads `write` or `TASK: Write a short
message ...`, a failure reason that reads `failure_reasons`, a disliked element that reads "the opposite
aesthetics the feedback rules out". Each is the task's own words handed back. These checks find them by
the studio's own vocabulary (the protocol's words, the reply fields, the rules), so what reaches the GPU,
the memory blocks or the user's style is about the video, never about the task.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import numpy as np

from mas.agents import clauses, style_check
from mas.agents import vocabulary as V
from mas.agents.protocol import PROTOCOL
from mas.agents.style import words_of

MARKERS = re.compile(r"\b(TASK|INPUT|REPLY|RULES)\b|\b[A-Za-z]+_[A-Za-z_]+\b")
"""The protocol's line names and snake_case field names (user_style, failure_reasons): never in a prompt."""

REQUEST_HANDED_BACK = re.compile(
    r"(?:^|[,.;:]\s*)(?:create|generate|make|render|write)\s+(?:\d+|a|an|one|two|three|some)?\s*(?:new\s+)?videos?\b"
    r"|\b(?:negative\s+)?prompt\s*:",
    re.IGNORECASE,
)
"""The request or the reply's own field handed back inside a prompt ("Create 2 videos of dragons", "prompt:"):
what the task says, not what the video shows."""

PROMPT_MIN_WORDS, PROMPT_MIN_CHARS = 4, 16
"""A prompt shorter than both cannot describe a video (subject, action, setting); the characters count for
scripts written without spaces."""

ECHO_SHARE = 0.5
"""A text is an echo when more than this share of its content words are the task's own words."""


def content_words(text: str) -> list[str]:
    """The words of `text` that say something (any script), lower case."""
    return [w for w in words_of(text) if w not in V.STOP_WORDS and w not in V.FILLER and len(w) > 1]


def _mentions(present: set[str], word: str) -> bool:
    """`word` in the words present, as a plural or compound (purples, blue-ish), or for a word of five
    letters or more by its first five (guardians in "guardian", phoenix in "phoenixes")."""
    return any(t == word or t == word + "s" or t.startswith(word + "-") or t.endswith("-" + word) for t in present) or (
        len(word) >= 5 and any(t.startswith(word[:5]) for t in present)
    )


def vocabulary(*texts: str) -> frozenset[str]:
    """The content words of the protocol and of `texts` (a task's rules, its reply shape): what an echo
    of the task is made of. Snake_case names count word by word (failure_reasons: failure, reasons)."""
    found = {w for t in (PROTOCOL, *texts) for w in content_words(t.replace("_", " "))}
    return frozenset(found | V.REQUEST_WORDS)


def is_echo(text: str, task_words: frozenset[str]) -> bool:
    """True when `text` is the task handed back: a protocol marker or field name, or mostly task words."""
    if MARKERS.search(text):
        return True
    said = content_words(text.replace("_", " "))
    if not said:
        return True
    return sum(w in task_words for w in said) / len(said) > ECHO_SHARE


def sensible(texts: Iterable[str], task_words: frozenset[str]) -> list[str]:
    """The texts that are not echoes of the task (failure reasons, learnings, strategies)."""
    return [t for t in texts if t.strip() and not is_echo(t, task_words)]


def concept_words(concept: str) -> list[str]:
    """What a prompt must name of its concept: the content words of its head (before the first comma or
    colon: `Guardian, episode 2: the trial` -> guardian), or of all of it when the head has none."""
    head = re.split(r"[,:]", concept, maxsplit=1)[0]
    return content_words(head) or content_words(concept)


def prompt_problems(prompt: str, *, concept: str, task_words: frozenset[str], previous: str = "") -> list[str]:
    """Why `prompt` is not a prompt for `concept` (empty when it is one), in words the model can act on."""
    problems = []
    present = set(words_of(prompt))
    wanted = concept_words(concept)
    english = style_check.readable(clauses.read(prompt))  # the concept is not looked for in other languages
    if english and wanted and not any(_mentions(present, w) for w in wanted):
        problems.append(f"the prompt must show the concept {concept!r}")
    if len(re.findall(r"\w+", prompt)) < PROMPT_MIN_WORDS and len(prompt.strip()) < PROMPT_MIN_CHARS:
        problems.append("the prompt must describe the video in a sentence (subject, action, setting, light)")
    elif is_echo(prompt, task_words) or REQUEST_HANDED_BACK.search(prompt):
        problems.append("the prompt repeats the task's instructions instead of describing the video")
    if previous and prompt.strip().lower() == previous.strip().lower():
        problems.append("the prompt must change the previous attempt's prompt to fix its failures")
    return problems


def missing_fixes(prompt: str, fixes: Sequence[str]) -> list[str]:
    """The fixes (`studio_rules.FIXES` phrases) whose words `prompt` does not all carry, a word under a rule-out
    ("without sharp focus") not counted (none looked for in a prompt the checks do not read)."""
    words = clauses.read(prompt)
    if not style_check.readable(words):
        return []
    present = {w.text for w in words if not w.ruled_out}
    return [f for f in fixes if not all(_mentions(present, w) for w in content_words(f))]


def about_request(concept: str, theme: str, *, task_text: str, meaning: style_check.Meaning | None) -> bool:
    """Whether a planned concept is about the request: it names the theme, or it is a scene of two words or
    more that means more like the theme than like the task's own text (a field name, `strategy"`, is not)."""
    said = content_words(concept)
    if any(_mentions(set(said), w) for w in content_words(theme)):
        return True
    if len(said) < CONCEPT_MIN_WORDS:
        return False
    if meaning is None:
        return True
    concept_v, theme_v, task_v = (np.asarray(v) for v in meaning.embed([concept, theme, task_text]))
    return float(concept_v @ theme_v) > float(concept_v @ task_v)


CONCEPT_MIN_WORDS = 2
"""A concept that does not name the theme is a scene of at least this many words."""
