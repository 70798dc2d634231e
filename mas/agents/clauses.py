"""English text as words with their polarity: what a clause asks for and what it rules out.

"I love blue but I can't stand yellow" likes blue and rules out yellow; "no red, orange or yellow" rules
out all three; "a fox under a sky with no red" does not ask for red. A negation holds to the end of its
clause; a contrast ("but", "however") or a new subject ("and I love ...") starts a clause of its own; a
comma-separated list with no word of polarity of its own goes on as the one before it. Words in a clause
that has no common English word and words the studio does not know are marked unreadable: the studio's
rules say nothing about them rather than something wrong. `parse` also says, clause by clause, whether the
reader accounts for every word (a cue, a style word, a word that cannot turn polarity round) and whether a
cue governs its style words: what the reader stores depends on both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from mas.agents import vocabulary as V

TOKEN = re.compile(r"[^\W\d_]+(?:['’-][^\W\d_]+)*|[,;.!?:\n()]")
SENTENCE_END = frozenset(";.!?:\n()")

_NEGATIVE = sorted((tuple(c.split()) for c in V.NEGATIVE_CUES), key=len, reverse=True)
_POSITIVE = sorted((tuple(c.split()) for c in V.POSITIVE_CUES), key=len, reverse=True)
_BACKWARD = frozenset(tuple(c.split()) for c in V.BACKWARD_NEGATIVE_CUES)
_BACK_POSITIVE = frozenset(tuple(c.split()) for c in V.BACKWARD_POSITIVE_CUES)
_PHRASE_WORDS = frozenset(w for p in V.ITEM_PHRASES for w in p.split()) - V.STOP_WORDS
_INTENSIFYING = frozenset(tuple(c.split()) for c in V.INTENSIFYING_CUES)
_PLAIN_NOT = frozenset({("not",), ("isn't",), ("aren't",)})
_COMPARING, _THAN = frozenset(V.COMPARING_CUES), frozenset(tuple(c.split()) for c in V.THAN_CUES)
_STRONG = frozenset(tuple(c.split()) for c in V.STRONG_POSITIVE)
_DONT_MIND = tuple(tuple(c.split()) for c in V.DOUBLE_NEGATIVE_LIKES)


@dataclass(frozen=True, kw_only=True)
class Word:
    """One word of a text, where it is, and how its clause holds it."""

    text: str  # lower case, as written (bright-eyed stays one word)
    start: int
    end: int
    ruled_out: bool  # said under a rule-out (no, never, avoid, don't like, ...)
    readable: bool  # its clause is English the studio reads
    name: bool  # part of a proper name ("Orange County", "Blue Mountains"): never a style word
    clause: int
    governed: bool = False  # a cue of its clause says its polarity (not only where it stands)


def _match(tokens: list[str], at: int, cues: list[tuple[str, ...]]) -> tuple[str, ...] | None:
    for cue in cues:
        if tuple(tokens[at : at + len(cue)]) == cue:
            return cue
    return None


def _is_name(raw: list[str], i: int, first: bool) -> bool:
    """A capitalised word that is not just the start of a sentence, or that runs into another capitalised
    word (Orange County, the Blue Mountains)."""
    word = raw[i]
    if not word[:1].isupper() or word == "I" or (word.isupper() and len(word) > 1):  # EPIC is emphasis
        return False
    neighbours = [raw[j] for j in (i - 1, i + 1) if 0 <= j < len(raw) and raw[j][:1].isalpha() and raw[j] != "I"]
    return not first or any(n[:1].isupper() for n in neighbours)


def _segments(tokens: list[str]) -> list[tuple[int, int, bool]]:
    """(start, end, continues) spans of clauses: `continues` when only a comma (not a stop, a contrast or a
    new subject) separated it from the one before."""
    spans, start, continues = [], 0, False
    for i, tok in enumerate(tokens):
        nxt = tokens[i + 1] if i + 1 < len(tokens) else ""
        before = tokens[i - 1] if i else ""
        if tok in SENTENCE_END or tok == ",":
            spans.append((start, i, continues))
            start, continues = i + 1, tok == "," and nxt not in V.SUBJECTS and nxt not in V.CONTRAST
        elif tok in V.CONTRAST and i > start and before not in ("anything", "everything"):
            spans.append((start, i, continues))
            start, continues = i, False
        elif tok in ("and", "or") and nxt in V.SUBJECTS and i > start:
            spans.append((start, i, continues))
            start, continues = i + 1, False
    spans.append((start, len(tokens), continues))
    return [s for s in spans if s[1] > s[0]]


def _sentences(tokens: list[str]) -> list[tuple[int, int]]:
    spans, start = [], 0
    for i, tok in enumerate(tokens):
        if tok in SENTENCE_END:
            spans.append((start, i))
            start = i + 1
    spans.append((start, len(tokens)))
    return spans


def _readable(words: list[str]) -> bool:
    """English the studio reads: no common word of another language, and a common English word or mostly
    words the studio knows."""
    if not words or any(w in V.FOREIGN_GLUE for w in words):
        return False
    return any(w in V.ENGLISH_GLUE for w in words) or sum(map(known, words)) / len(words) >= KNOWN_SHARE


KNOWN_SHARE = 0.5
"""A sentence with no common English word is read when at least this share of its words are the studio's."""


def _is_item(token: str) -> bool:
    return (known(token) and token not in V.ENGLISH_GLUE) or token in ("and", "or") or token in V.STOP_WORDS


def known(token: str) -> bool:
    """A word the studio's rules know: common English, a word of the vocabulary or of its polarity cues
    ("stand" of "can't stand"), or the plural of one ("pastels")."""
    if token.endswith("s") and len(token) > 3 and _known(token[:-1]):
        return True
    return _known(token)


def _known(token: str) -> bool:
    return (
        token in V.ENGLISH_GLUE
        or token in V.COLOR_FAMILIES
        or token in V.MOODS
        or token in V.THEMES
        or token in V.PACING
        or token in V.PACING_NOUNS
        or token in V.FILLER
        or token in V.CRAFT
        or any(token in c for c in _NEGATIVE + _POSITIVE)
    )


def read(text: str) -> list[Word]:
    """Every word of `text` with its polarity, readability and whether it is part of a name."""
    return parse(text).words


@dataclass(frozen=True, kw_only=True)
class Clause:
    """One clause of a text and whether the reader accounts for all of it: every word a cue it knows, a
    style word or a word that cannot turn polarity round (`why` says what it could not read, when not)."""

    number: int
    start: int
    end: int
    why: str = ""  # empty: accounted for
    cued: bool = False  # a cue of its own (or one reaching back into it) says its polarity

    @property
    def accounted(self) -> bool:
        return not self.why


@dataclass(frozen=True, kw_only=True)
class Parsed:
    words: list[Word]
    clauses: list[Clause]


def parse(text: str) -> Parsed:
    """`read`, with each clause accounted for or not (see `Clause`)."""
    found = [(m.group(), m.start(), m.end()) for m in TOKEN.finditer(text)]
    raw = [t for t, _, _ in found]
    tokens = [t.lower().replace("’", "'") for t in raw]
    readable = [False] * len(tokens)
    foreign = any(t in V.FOREIGN_GLUE for t in tokens)  # one sentence in French: the rest is not English either
    for start, end in [] if foreign else _sentences(tokens):
        said = [t for t in tokens[start:end] if t != ","]
        readable[start:end] = [_readable(said)] * (end - start)
    words: list[Word] = []
    parts: list[Clause] = []
    carried: bool | None = None  # the polarity a continuing list inherits (True: ruled out, None: no cue)
    last_cued, last_words = True, (0, 0)  # whether the previous clause had a cue; its words
    for number, (start, end, continues) in enumerate(_segments(tokens)):
        span = [t for t in tokens[start:end] if t not in SENTENCE_END and t != ","]
        cues = [c for i in range(start, end) if (c := _match(tokens, i, _NEGATIVE + _POSITIVE))]
        why = _unreadable(tokens[start:end], foreign)
        reaches_back = bool(cues) and not last_cued and (cues[0] in _BACKWARD or cues[0] in _BACK_POSITIVE)
        reaches_back = reaches_back and _only_cues(tokens, start, end)
        if reaches_back:  # "orange, never": the cue alone reaches back
            for k in range(*last_words):
                words[k] = replace(words[k], ruled_out=cues[0] in _BACKWARD, governed=True)
            if parts:
                parts[-1] = replace(parts[-1], cued=True)
        inherits = continues and not cues and all(map(_is_item, span))
        trusted = not inherits or not parts or parts[-1].accounted  # a list goes on as a clause the reader read
        state = carried if inherits else None
        pending: list[int] = []
        first_word = len(words)
        comparing, negated_bare = False, False  # a negation with no style word after it yet
        last_negative: tuple[str, ...] = ()
        i = start
        while i < end:
            comparing = comparing or tokens[i] in _COMPARING
            dont_mind = _match(tokens, i, list(_DONT_MIND))
            negative = None if dont_mind else _match(tokens, i, _NEGATIVE)
            if negative is None and comparing and (tokens[i],) in _THAN:
                negative = (tokens[i],)
            positive = dont_mind or (None if negative else _match(tokens, i, _POSITIVE))
            if negative:
                if (
                    negated_bare
                    and negative != ("nor",)
                    and not (negative in _INTENSIFYING and last_negative not in _PLAIN_NOT)
                ):
                    why = why or "a second negation"
                last_negative = negative
                if state is None and (negative in _BACKWARD or negative in _BACK_POSITIVE):
                    for k in pending:
                        words[k] = replace(words[k], ruled_out=negative in _BACKWARD, governed=True)
                state, pending, negated_bare = True, [], True
                i += len(negative)
                continue
            if positive:
                if state is None and positive in _BACK_POSITIVE:
                    for k in pending:
                        words[k] = replace(words[k], ruled_out=False, governed=True)
                if state is not True or positive in _STRONG or dont_mind:
                    state = False
                pending = []
                i += len(positive)
                continue
            tok = tokens[i]
            if tok not in SENTENCE_END and tok != ",":
                first = i == start or tokens[i - 1] in SENTENCE_END
                style = style_word(tok)
                negated_bare = negated_bare and not style
                if not style and tok not in V.NEUTRAL and tok not in V.CONTRAST and tok not in ("and", "or"):
                    why = why or _reason(tok)
                words.append(
                    Word(
                        text=tok,
                        start=found[i][1],
                        end=found[i][2],
                        ruled_out=bool(state),
                        readable=readable[i],
                        name=_is_name(raw, i, first),
                        clause=number,
                        governed=state is not None and trusted,
                    )
                )
                if state is None:
                    pending.append(len(words) - 1)
            i += 1
        mine = words[first_word:]
        styled = [w for w in mine if names_item(w.text)]
        if cues and not styled and not reaches_back:
            why = why or "a rule or a wish about something it does not name"
        if any(not w.governed for w in styled) and cues:
            if any(_match(tokens, k, _NEGATIVE) for k in range(start, end)):
                why = why or "what its rule-out reaches"
            for k in range(first_word, len(words)):  # before a wish only: "sunsets and more gold"
                if not words[k].governed:
                    words[k] = replace(words[k], governed=True)
        if span:
            parts.append(
                Clause(
                    number=number,
                    start=found[start][1],
                    end=found[end - 1][2],
                    why=why,
                    cued=bool(cues) or (inherits and trusted and carried is not None),
                )
            )
        carried = state
        last_cued, last_words = bool(cues), (first_word, len(words))
    return Parsed(words=words, clauses=parts)


def style_word(token: str) -> bool:
    """A word of a style item: a colour, mood, theme or pacing word (or its plural or comparative), a word of
    an item of several words, or a word that names an aspect ("tones", "vibe")."""
    return (
        any(
            f in V.COLOR_FAMILIES
            or f in V.MOODS
            or f in V.THEMES
            or f in V.PACING
            or f in V.PACING_NOUNS
            or f in V.FILLER
            for f in forms(token)
        )
        or token in _PHRASE_WORDS
    )


def names_item(token: str) -> bool:
    """A style word that is more than an aspect's name ("teal", "quick"; not "tones")."""
    return style_word(token) and token not in V.FILLER and not (token.endswith("s") and token[:-1] in V.FILLER)


def forms(word: str) -> list[str]:
    """`word` and the forms the vocabulary may know it by: its singular (golds), the adjective of a
    comparative (darker, moodier)."""
    return [
        f
        for f in (
            word,
            word[:-1] if word.endswith("s") else "",
            word[:-3] + "y" if word.endswith("ier") else "",
            word[:-2] if word.endswith("er") else "",
            word[:-3] if word.endswith("ter") else "",
        )
        if f
    ]


def _reason(token: str) -> str:
    if token in V.TENSE_WORDS:
        return f"a change of tense ({token!r})"
    if token in V.COMPARISON_WORDS:
        return f"a comparison ({token!r})"
    return f"the word {token!r}"


def _unreadable(tokens: list[str], foreign: bool) -> str:
    if foreign or any(ord(ch) > LATIN_END for t in tokens for ch in t):
        return "a language the studio does not read"
    return ""


LATIN_END = 0x24F
"""The last code point of the Latin alphabets (accented letters included)."""


def _only_cues(tokens: list[str], start: int, end: int) -> bool:
    i = start
    while i < end:
        cue = _match(tokens, i, _NEGATIVE + _POSITIVE)
        if cue is None and tokens[i] not in SENTENCE_END and tokens[i] != ",":
            return False
        i += len(cue) if cue else 1
    return True


def english_share(words: list[Word]) -> float:
    """The share of the words that are common English words: near 0 for French, German or Japanese."""
    said = [w for w in words if not w.name]
    return sum(w.text in V.ENGLISH_GLUE for w in said) / len(said) if said else 0.0
