"""A prompt against the user's style, by meaning: does it carry what they like and name nothing they ruled
out? And the studio's repair of a prompt that misses.

Colours are judged by family (violet is purple, cobalt is blue), moods and pacing by meaning groups
(brooding is moody), other words by the embedding model (MiniLM) above a threshold set on the labelled set
(`bench/style_bench.py`). "no red" in a prompt does not ask for red; "Orange County" and "bright-eyed" are
not colours or moods. A ruled-out item of several words is named by all its words, or by a part of the
prompt that means it as a whole. A prompt in a language the checks do not read, or one that may show a
ruled-out item the rules do not find (a clause too near it to pass and too far to refuse, a theme the prompt
is about), is not judged here: its check says so (unchecked), and a model-backed writer
asks its model (`mas.agents.prompt_check`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from mas.agents import clauses
from mas.agents import vocabulary as V
from mas.agents.style import Style, StyleItem, colour_families, colour_words, covers, normalized

MIN_ENGLISH_SHARE = 0.05
"""A prompt with fewer common English words than this share is not English the checks read (an English
prompt of twenty words has a, the, of, with ...; French, German or Japanese has none)."""

CARRIES_SIMILARITY = 0.62
"""A liked item with no word of its own or of its meaning group in the prompt is still carried when a
prompt word outside every group is this near it (cosine, MiniLM): "underwater" and "ocean depths"."""

NAMES_SIMILARITY = 0.75
"""A ruled-out item is named by a prompt word outside every group only this near it: refusing a good
prompt costs more than a near-synonym slipping through."""

THEME_SIMILARITY = 0.16
"""A liked theme is what a whole prompt is about, not a word in it ("a sorceress atop a castle as dragons
circle" is fantasy): it is carried when the prompt as a whole is this near it (cosine, MiniLM). Low on
purpose: set on the labelled set (`bench/style_bench.py --sweep`), where prompts off the theme (a glass
office for "gothic") sit below 0.15 and prompts on it from 0.17."""

THEME_RANK = 3
"""A ruled-out theme a prompt names in none of its words is not sure when it is among the prompt's this many
nearest themes (of the studio's ~70, `vocabulary.THEMES`): asked of a model, or unchecked. On the tuning part
the good prompts with a ruled-out theme rank it 11th or lower."""

PHRASE_SIMILARITY = 0.5
"""A ruled-out item of several words is named by a clause of the prompt at least this near it as a whole
(cosine, MiniLM): set on the tuning part of the labelled prompts (`bench/style_bench.py --part tune --sweep`)."""

UNSURE_SIMILARITY = 0.4
"""The lower edge of the band where the checks cannot tell, with no model to ask: a ruled-out item of several
words that the rules do not find, with a clause of the prompt at least this near it as a whole (cosine,
MiniLM; above the band, from `PHRASE_SIMILARITY`, the rules name it), is not sure, and the prompt is recorded
unchecked. MiniLM puts a description of the item ("bright anamorphic streaks and glare", 0.45 from "lens
flares") and of its opposite ("locked-off tripod shot, steady and still", 0.46 from "handheld camera") in the
same band, so no threshold separates them, and a reader that is not sure does not guess. Set on the tuning
part (`bench/style_bench.py --part tune --sweep`): lower edges leave more prompts unchecked, and the studio's
own short prompts most ("..., medium shot": a camera phrase sits 0.25-0.4 from most camera items; 2 of 184
clean pairs at 0.4, 27 at 0.25)."""

ASK_SIMILARITY = 0.25
"""The same edge when a model is there to ask (`mas.agents.prompt_check`): a question costs one short call, not
a warning on the video, so the band reaches lower. Set on the tuning part: a model that answers right then
catches 47 of the 50 bad prompts (43 at 0.4), none refused; SmolLM2 and Gemma 3 270M, asked from here on the
test part, refused no good prompt. Only model-written prompts are asked; the studio's own are not."""


class Meaning(Protocol):
    """Sentence embeddings: unit vectors for texts (`mas.memory.embeddings.Embedder`)."""

    def embed(self, texts: list[str]) -> list[list[float]]: ...


@dataclass(frozen=True, kw_only=True)
class StyleCheck:
    """How one prompt stands against the user's style."""

    checked: bool = True  # False: the checks cannot read the prompt or tell `unsure`, and no model checked it
    by: str = "studio"  # studio (its own checks) | model (asked: the studio could not read the prompt or tell)
    missing: list[str] = field(default_factory=list)  # liked items the prompt does not carry
    disliked: list[str] = field(default_factory=list)  # ruled-out items the prompt names
    unsure: list[str] = field(default_factory=list)  # ruled-out items the checks cannot tell it shows or not

    @property
    def applied(self) -> bool:
        return self.checked and not self.missing and not self.disliked

    def problems(self) -> list[str]:
        """What is wrong, in words a model (or a person) can act on (nothing when unchecked)."""
        out = []
        if self.missing:
            out.append(f"the prompt must carry the user's preferences: {', '.join(self.missing)}")
        if self.disliked:
            out.append(f"the prompt must not ask for what the user ruled out: {', '.join(self.disliked)}")
        return out

    def as_json(self) -> dict[str, Any]:
        return {
            "checked": self.checked,
            "by": self.by if self.checked else "",
            "applied": self.applied,
            "missing": self.missing,
            "disliked": self.disliked,
            "unsure": self.unsure,
        }

    @property
    def state(self) -> str:
        """How the prompt stands, in a word for people: applied, refused, or unchecked."""
        return "unchecked" if not self.checked else "applied" if self.applied else "refused"


SHORT_WORDS = 6
"""Fewer words than this say too little to tell a language by: a short text in Latin letters with no common
word of another language is read (so "write" is still seen as the task handed back)."""


def readable(words: Sequence[clauses.Word]) -> bool:
    """Whether the checks read this text: English. Not when it has another script or another language's
    common words; else when it has common English words, is mostly words the studio knows (its own prompts,
    "dark, moody, purple colours, slow dolly-in"), or is too short to tell."""
    if any(ord(ch) > clauses.LATIN_END for w in words for ch in w.text) or any(w.text in V.FOREIGN_GLUE for w in words):
        return False
    known = sum(clauses.known(w.text) for w in words) / len(words) if words else 1.0
    return (
        len(words) < SHORT_WORDS
        or clauses.english_share(list(words)) >= MIN_ENGLISH_SHARE
        or known >= clauses.KNOWN_SHARE
    )


def _said(words: Sequence[clauses.Word]) -> list[clauses.Word]:
    """The words a prompt asks for: not under a negation, not part of a name, not filler."""
    return [w for w in words if not w.ruled_out and not w.name and w.text not in V.STOP_WORDS]


SHOT_WORDS = frozenset("camera cam shot shots footage filmed filming close-up closeup".split())
"""Words for the camera's take: in a ruled-out item of several words ("static camera", "handheld camera") any
of them is the item's word ("static wide shot", "handheld close-up")."""


def _known(word: str) -> bool:
    """A word the studio reads by its rules (a craft, pacing, mood or colour word, common English), its
    hyphenated parts too ("dolly-in"): a clause of such words says what they say, and is no description of a
    ruled-out item in other words ("tracking shot" is not handheld camera, "slow dolly-in" not slow motion):
    the rules name the item there by its words or not at all."""
    return clauses.known(word) or all(clauses.known(p) for p in word.split("-") if p)


def _stem(word: str) -> str:
    """A word without its ending (lingers, lingering: linger), for words of five letters or more."""
    return re.sub(r"(ing|ed|es|s)$", "", word) if len(word) >= 5 else word


REQUIRED_ASPECTS = ("colour", "mood", "pacing", "theme")
"""The liked aspects every prompt carries: the seed's colour, mood and pacing, and the user's themes (judged
by what the whole prompt is about, `THEME_SIMILARITY`); an "other" item (a camera, a film grain) is a wish,
not a rule. Every ruled-out item is a rule."""


class _Judge:
    """One prompt's words, compared with style items."""

    def __init__(self, prompt: str, meaning: Meaning | None, style: Style | None = None) -> None:
        self.prompt = prompt
        self.excepted = {c for i in style.liked for c in colour_words(i.words)} if style else set()
        self.words = clauses.read(prompt)
        self.said = _said(self.words)
        self.meaning = meaning
        self._vectors: dict[str, np.ndarray] = {}

    def _vector(self, texts: list[str]) -> dict[str, np.ndarray]:
        wanted = [t for t in dict.fromkeys(texts) if t not in self._vectors]
        if wanted and self.meaning is not None:
            self._vectors.update(zip(wanted, np.asarray(self.meaning.embed(wanted), dtype=np.float32), strict=True))
        return self._vectors

    def matches(self, item: StyleItem) -> list[clauses.Word]:
        """The prompt's words that say `item` (empty when none). A liked item is said by any of its words,
        their meaning group, or a part of a compound (rapid-fire); a ruled-out one of several words only by
        all of them, and never by a part of a compound (bright-eyed is not bright)."""
        wanted = colour_words(item.words)
        if wanted and item.liked:  # any shade of its families carries a liked colour (teal carries blue)
            families = colour_families(item.words)
            return [w for w in self.said if colour_families(w.text) & families]
        if wanted:  # a ruled-out colour is named by itself or, for a family's name, its shades (not one liked)
            return [
                w
                for w in self.said
                if any(covers(c, p) and p not in self.excepted for c in wanted for p in colour_words(w.text))
            ]
        key = [w for w in normalized(item.words).split() if w not in V.STOP_WORDS]
        if not key:
            return []
        found = [w for w in self.said if any(self._says(w.text, k, compounds=item.liked) for k in key)]
        if not item.liked and len(key) > 1:
            if all(any(self._says(w.text, k, compounds=False) for w in found) for k in key):
                return found
            return self._described(item) if self.meaning is not None else []
        if found or self.meaning is None:
            return found
        if item.liked and item.aspect == "theme":
            return self._about(item)
        return self._near(item, key)

    def _about(self, item: StyleItem) -> list[clauses.Word]:
        """The whole prompt, as words, when it is about the theme `item` names (empty when not)."""
        vectors = self._vector([item.words, self.prompt])
        return list(self.said) if float(vectors[item.words] @ vectors[self.prompt]) >= THEME_SIMILARITY else []

    def _nearness(self, item: StyleItem) -> list[tuple[float, list[clauses.Word]]]:
        """Each clause of the prompt (its words said) with how near it is to the item as a whole."""
        parts: dict[int, list[clauses.Word]] = {}
        for w in self.said:
            parts.setdefault(w.clause, []).append(w)
        parts = {n: ws for n, ws in parts.items() if not all(_known(w.text) for w in ws)}  # read, not described
        texts = {n: self.prompt[ws[0].start : ws[-1].end] for n, ws in parts.items()}
        vectors = self._vector([item.words, *texts.values()])
        return [(float(vectors[item.words] @ vectors[text]), parts[n]) for n, text in texts.items()]

    def _described(self, item: StyleItem) -> list[clauses.Word]:
        """The words of each clause of the prompt that means the item as a whole ("filmed on a wobbly hand-held
        camcorder" for a ruled-out "handheld camera"): a thing of several words is named by a phrase, not a word."""
        return [w for near, words in self._nearness(item) if near >= PHRASE_SIMILARITY for w in words]

    def unsure(self, item: StyleItem, edge: float) -> bool:
        """Whether the checks cannot tell if the prompt shows the ruled-out `item`, a thing of several words
        (time-lapse and close-ups are two) or a theme: the rules do not find it, and the prompt's nearest clause
        is in the band where MiniLM cannot tell (from `edge`), or, for a theme, the prompt as a whole is
        about it (`_nearest_theme`: spaceships and robot soldiers for sci-fi)."""
        if item.liked or self.meaning is None or colour_words(item.words):
            return False
        if item.aspect == "theme":
            return not self.matches(item) and self._nearest_theme(item)
        if len(re.split(r"[\s-]+", item.words.strip())) < 2 or self.matches(item):
            return False
        return max((n for n, _ in self._nearness(item)), default=0.0) >= edge

    def _nearest_theme(self, item: StyleItem) -> bool:
        """Whether what the prompt says (its ruled-out words left out) has the theme `item` among its
        `THEME_RANK` nearest of the themes the studio knows, at least `THEME_SIMILARITY` near: MiniLM ranks a
        theme's near kin close together (spaceships: space, then sci-fi), so the top few, not the first."""
        said = " ".join(w.text for w in self.said)
        themes = sorted(V.THEMES | {item.words.lower()})
        vectors = self._vector([said, *themes])
        near = sorted(((float(vectors[t] @ vectors[said]), t) for t in themes), reverse=True)
        return any(t == item.words.lower() and n >= THEME_SIMILARITY for n, t in near[:THEME_RANK])

    @staticmethod
    def _says(text: str, key: str, *, compounds: bool) -> bool:
        if key in SHOT_WORDS and text in SHOT_WORDS:
            return True
        forms = [text, *text.split("-")] if compounds else [text]
        groups = V.MEANINGS.get(key, frozenset())
        return any(_stem(f) == _stem(key) or bool(groups & V.MEANINGS.get(f, frozenset())) for f in forms)

    def _near(self, item: StyleItem, key: list[str]) -> list[clauses.Word]:
        """Words outside every meaning group (and not compounds of the item's words) that the embedding
        model puts near the item."""
        unknown = [
            w
            for w in self.said
            if w.text not in V.MEANINGS
            and w.text not in V.COLOR_FAMILIES
            and not set(w.text.split("-")) & set(key)
            and len(w.text) > 2
        ]
        if not unknown:
            return []
        phrase = " ".join(key)
        vectors = self._vector([phrase, *(w.text for w in unknown)])
        threshold = CARRIES_SIMILARITY if item.liked else NAMES_SIMILARITY
        return [w for w in unknown if float(vectors[phrase] @ vectors[w.text]) >= threshold]


def check(prompt: str, style: Style, meaning: Meaning | None = None, *, asking: bool = False) -> StyleCheck:
    """Which liked items `prompt` does not carry and which ruled-out items it names (by meaning). A prompt the
    rules pass that may still show a ruled-out item (`_Judge.unsure`) is unchecked, the items named; `asking`:
    for a model to be asked of them, so from the lower edge (`ASK_SIMILARITY`)."""
    if not style.items:
        return StyleCheck()
    judge = _Judge(prompt, meaning, style)
    if not readable(judge.words):
        return StyleCheck(checked=False)
    missing = [i.words for i in style.liked if i.aspect in REQUIRED_ASPECTS and not judge.matches(i)]
    disliked = [i.words for i in style.ruled_out if judge.matches(i)]
    if missing or disliked:
        return StyleCheck(missing=missing, disliked=disliked)
    edge = ASK_SIMILARITY if asking else UNSURE_SIMILARITY
    unsure = [i.words for i in style.ruled_out if judge.unsure(i, edge)]
    return StyleCheck(checked=not unsure, unsure=unsure)


def repair(prompt: str, style: Style, meaning: Meaning | None = None) -> str:
    """`prompt` with every word that names a ruled-out item taken out whole (never inside "bright-eyed" or
    "Orange County") and the liked items it misses added in the user's own words."""
    judge = _Judge(prompt, meaning, style)
    if not readable(judge.words):
        return prompt
    cut = sorted(
        {(w.start, w.end) for i in style.ruled_out for w in judge.matches(i)},
        reverse=True,
    )
    for start, end in cut:
        prompt = prompt[:start] + prompt[end:]
    prompt = re.sub(r"\s+([,.;])", r"\1", re.sub(r"(,\s*)+,", ",", re.sub(r"[ \t]{2,}", " ", prompt)))
    prompt = prompt.strip(" ,")
    missing = set(check(prompt, style, meaning).missing)
    added = style.phrases(only=[i for i in style.liked if i.words in missing and i.aspect in REQUIRED_ASPECTS])
    return appended(prompt.rstrip(". "), added)


def appended(prompt: str, phrases: Sequence[str]) -> str:
    """`prompt` with `phrases` added at its end where no rule-out of its last clause reaches them: after a comma
    when they are still said there, else as a sentence of their own ("a harbour without boats. Blue tones"),
    since "a harbour without boats, blue tones" asks for no blue."""
    if not phrases:
        return prompt
    base = prompt.rstrip(". ")
    joined = ", ".join(p for p in [base, *phrases] if p)
    if not base or not any(w.ruled_out for w in clauses.read(joined) if w.start > len(base)):
        return joined
    sentence = ", ".join(phrases)
    return f"{base}. {sentence[:1].upper()}{sentence[1:]}"
