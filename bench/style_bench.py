"""How well the studio understands its user's words, on a labelled set of its own (`bench/style_labels/`).

The labelled sets are split in two, fixed by a hash of each sentence (`part`): a tuning part, the only one
cue lists and thresholds are set on, and a test part, reported by construction class. `test_feedbacks.json`
is test only: sentences written for the classes the reader once guessed on (swap, tense, double negative,
idiom, loanword, languages it has no word list for), none of them a variant of a tuning sentence.

Feedbacks (what each likes and rules out, in English words, whatever its language) are read by each reader
and stored as `mas style` stores them (`Style.learned`); what is stored is compared with the label: precision
and recall of liked and of ruled-out items, polarity inversions (an item stored liked that the label rules
out, or the reverse; a colour of a family the label names only on the other side counts: "without violet"
stored as liked amethyst), and each feedback's outcome: stored as labelled, not understood (nothing wrong
stored, and the reader said what it did not understand), or wrong (inverted, or an item stored or left out
without a word). A model reader's disagreements with the studio's own reader are counted. Readers:

- `studio`: the studio's own reader (the offline backend, and the fallback of the model-backed ones);
- `labelled`: a stand-in model that answers each feedback with its labelled reading, through the same
  question, validation and fallback as a real model (what a capable model's reading becomes);
- `smollm2`, `gemma3`: real small models on llama.cpp's server (`scripts/llm-server-env.sh`,
  `scripts/gemma-model.sh`), asked by the llm backend in a studio of their own.

Prompts (`prompts.json`: a prompt, the style it is judged against, whether it carries the liked items and
whether it names a ruled-out one) are checked by `mas.agents.style_check` with the MiniLM model: good prompts
refused (false refusals), bad English prompts let through (misses), prompts left unchecked (another language,
or a ruled-out item the checks are not sure of). Each is checked twice: without a model (caught, passed,
unchecked), and as a model-backed writer checks it (`mas.agents.prompt_check`), with the `labelled` stand-in
answering the `check_style` question from the prompt's labels (and real models, `--checkers smollm2,gemma3`).
`--sweep` adds the thresholds' sweeps, the band's with the studio's own short prompts (`short_prompts.json`,
each against every ruled-out item: a tuning set, written while choosing).

    python bench/style_bench.py --part tune --verbose            # what the rules may be tuned on
    python bench/style_bench.py --readers studio,labelled,smollm2,gemma3 --output bench/RESULTS-style.md
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness import ROOT, command_line, machine, provenance

from mas.agents import prompt_check, style_check, style_reader
from mas.agents.asking import AskingDirector
from mas.agents.protocol import Question
from mas.agents.reading import one_sided_families
from mas.agents.replies import NoValidReply, problem
from mas.agents.roles import Reading
from mas.agents.style import Style, StyleItem, colour_families, normalized
from mas.domain.identity import STUDIO
from mas.errors import RetryableError
from mas.memory.embedding_export import default_cache_dir
from mas.memory.embeddings import default_model_path, open_embedder
from tests.llm_server import VERSION as LLM_VERSION

LABELS = ROOT / "bench" / "style_labels"
Reader = Callable[[str], Reading]

TEST_SHARE = 3
"""One sentence in this many is in the test part (by its hash)."""


def part(text: str) -> str:
    """ "test" or "tune", fixed by a hash of the sentence: no choice of the person tuning moves one."""
    return "test" if int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) % TEST_SHARE == 0 else "tune"


def load(kind: str, which: str) -> list[dict]:
    """The labelled `kind` (feedbacks, prompts) of one part; the test part also has `test_<kind>.json`."""
    entries = [
        e
        for name in (f"{kind}.json", f"holdout_{kind}.json")
        for e in json.loads((LABELS / name).read_text())
        if part(e.get("feedback") or e["prompt"]) == which
    ]
    extra = LABELS / f"test_{kind}.json"
    if which == "test" and extra.exists():
        entries += [{**e, "new": True} for e in json.loads(extra.read_text())]
    return entries


def classes(entry: dict) -> list[str]:
    """The construction classes a feedback is counted under: its kinds, and its language when not English."""
    kinds = [k for k in entry["kinds"] if k != "foreign"]
    return [*kinds, f"language: {entry['lang']}"] if entry["lang"] != "en" else kinds


def labelled(entry: dict) -> list[StyleItem]:
    return [
        StyleItem(aspect=i["aspect"], words=i["words"], liked=liked)
        for liked, key in ((True, "liked"), (False, "ruled_out"))
        for i in entry[key]
    ]


def _same_words(a: StyleItem, b: StyleItem) -> bool:
    """The same preference for scoring: the same words (plural or filler aside), or one item's words
    inside the other's ("quick cuts" and "quick")."""
    x, y = (re.sub(r"s\b", "", normalized(i.words)) for i in (a, b))
    return bool(x and y) and (x == y or f" {x} " in f" {y} " or f" {y} " in f" {x} ")


def _inverted(stored: StyleItem, label: StyleItem) -> bool:
    """The stored item says the opposite of a labelled one: the same words, or a colour that one of them
    rules out ("no red" stored, crimson labelled liked)."""
    return stored.liked != label.liked and (_same_words(stored, label) or stored.contradicts(label))


OUTCOMES = ("as labelled", "not understood", "wrong", "inverted")


@dataclass
class Score:
    """Counts over feedbacks, per polarity."""

    right: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})
    stored: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})
    labelled: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})
    inversions: list[str] = field(default_factory=list)
    exact: int = 0
    feedbacks: int = 0
    by_model: int = 0
    wrong: list[str] = field(default_factory=list)
    unanswered: list[str] = field(default_factory=list)
    unread: int = 0
    disagreed: int = 0
    by_class: dict[str, dict[str, int]] = field(default_factory=dict)

    def add(self, entry: dict, stored: list[StyleItem], label: list[StyleItem], reading: Reading) -> str:
        """Counts one feedback; its outcome: "as labelled", "not understood", "wrong" or "inverted"."""
        feedback = entry["feedback"]
        self.feedbacks += 1
        self.by_model += reading.source == "model" and bool(reading.items or not reading.not_understood)
        self.disagreed += bool(reading.disagreements)
        exact = len(stored) == len(label)
        stray = inverted = False
        for item in stored:
            self.stored[item.liked] += 1
            right = any(_same_words(item, x) and x.liked == item.liked for x in label)
            if right:
                self.right[item.liked] += 1
            else:
                exact, stray = False, True
            # "without violet" stored as liked amethyst; "no yellow, but gold" stored as labelled is none
            if not right and (
                any(_inverted(item, x) for x in label)
                or colour_families(item.words) & one_sided_families(label, liked=not item.liked)
            ):
                inverted = True
                self.inversions.append(f"{feedback!r}: {item.words} stored {'liked' if item.liked else 'ruled out'}")
        for item in label:
            self.labelled[item.liked] += 1
        if exact:
            outcome = "as labelled"
        elif inverted:
            outcome = "inverted"
        elif not stray and reading.not_understood:
            outcome = "not understood"
        else:
            outcome = "wrong"
        if not exact:
            said = "; not understood: " + " | ".join(reading.not_understood)
            self.wrong.append(f"{outcome}: {feedback!r}: stored {_show(stored)}; label {_show(label)}{said}")
        self.exact += exact
        self.unread += outcome == "not understood"
        for name in classes(entry):
            counts = self.by_class.setdefault(name, dict.fromkeys(OUTCOMES, 0))
            counts[outcome] += 1
        return outcome

    def figures(self) -> dict:
        def ratio(n: int, d: int) -> float | None:
            return round(n / d, 3) if d else None

        return {
            "feedbacks": self.feedbacks,
            "read by the model": self.by_model,
            "liked precision": ratio(self.right[True], self.stored[True]),
            "liked recall": ratio(self.right[True], self.labelled[True]),
            "ruled-out precision": ratio(self.right[False], self.stored[False]),
            "ruled-out recall": ratio(self.right[False], self.labelled[False]),
            "polarity inversions": len(self.inversions),
            "stored as labelled": ratio(self.exact, self.feedbacks),
            "not understood": self.unread,
            "disagreed": self.disagreed,
            "unanswered": len(self.unanswered),
        }


def _show(items: list[StyleItem]) -> str:
    return "[" + ", ".join(("+" if i.liked else "-") + i.words for i in items) + "]"


def score_reader(read: Reader, feedbacks: list[dict]) -> dict[str, Score]:
    """Scores of one reader over English and foreign feedbacks apart."""
    scores = {"en": Score(), "foreign": Score()}
    for entry in feedbacks:
        group = "en" if entry["lang"] == "en" else "foreign"
        try:
            reading = read(entry["feedback"])
        except RetryableError as error:  # the model server did not answer in time: no reading, counted
            scores[group].unanswered.append(f"{entry['feedback']!r}: {error}")
            continue
        stored, _ = Style().learned(reading.items)
        scores[group].add(entry, list(stored.items), labelled(entry), reading)
    return scores


class LabelledModel:
    """A stand-in model (no network, no weights): answers `read_style` with the feedback's labelled reading,
    and `check_style` from the prompt's labels (which say whether it shows a ruled-out item, not which: every
    ruled-out item asked about is named when it does, every liked one asked about when it misses one),
    validated as a real model's reply is, and asked again with the problems the same way."""

    def __init__(self, feedbacks: Sequence[dict], prompts: Sequence[dict] = (), *, tries: int = 3) -> None:
        self._answers = {e["feedback"]: e for e in feedbacks}
        self._prompts = {e["prompt"]: e for e in prompts}
        self._tries = tries

    def ask(self, question: Question):
        if question.task == "check_style":
            asked, label = question.payload, self._prompts[question.payload["prompt"]]
            answer = {
                "shows_ruled_out": asked["ruled_out"] if label["names_ruled_out"] else [],
                "misses_liked": [] if label["carries"] else asked["liked"],
            }
        else:
            entry = self._answers[question.payload["feedback"]]
            answer = {"liked": entry["liked"], "ruled_out": entry["ruled_out"]}
        errors = []
        for _ in range(self._tries):
            try:
                return question.reply.model_validate(answer, context=question.context)
            except Exception as exc:
                errors.append(problem(exc) if hasattr(exc, "errors") else str(exc))
        raise NoValidReply("; ".join(errors[-1:]))


STATES = {"refused": "caught", "applied": "passed", "unchecked": "unchecked"}
"""A check's state, as the prompt figures count it."""


def score_prompts(
    prompts: list[dict], meaning: style_check.Meaning | None, askers: dict[str, prompt_check.Asker] | None = None
) -> dict:
    """False refusals of good prompts, misses of bad English ones, and prompts left unchecked; and how each
    kind of prompt ends without a model and with each of `askers` asked (`states`: (asker, state) counts)."""
    good = {"en": [0, 0], "foreign": [0, 0]}  # [refused, of]
    bad_en = {"missing": [0, 0], "names": [0, 0], "any": [0, 0]}  # [caught, of]
    unchecked = {"en": 0, "foreign": 0}
    states: dict[str, Counter] = {}
    notes = []
    for entry in prompts:
        style = Style(items=tuple(labelled(entry["style"])))
        check = style_check.check(entry["prompt"], style, meaning)
        group = "en" if entry["lang"] == "en" else "foreign"
        unchecked[group] += not check.checked
        refused = check.checked and not check.applied
        is_good = entry["carries"] and not entry["names_ruled_out"]
        counts = states.setdefault(
            f"{'good' if is_good else 'bad'} {'English' if group == 'en' else 'foreign'}", Counter()
        )
        counts["none", STATES[check.state]] += 1
        for name, asker in (askers or {}).items():
            counts[name, STATES[prompt_check.checked(asker, entry["prompt"], style, meaning).state]] += 1
        if check.unsure:
            notes.append(f"unsure ({'good' if is_good else 'bad'}): {entry['prompt']!r}: {check.unsure}")
        if is_good:
            good[group][1] += 1
            good[group][0] += refused
            if refused:
                notes.append(f"refused good: {entry['prompt']!r}: {check.problems()}")
        elif group == "en":
            for kind, bad, seen in (
                ("missing", not entry["carries"], bool(check.missing)),
                ("names", entry["names_ruled_out"], bool(check.disliked)),
                ("any", True, refused),
            ):
                if bad:
                    bad_en[kind][1] += 1
                    bad_en[kind][0] += seen
            if check.applied:
                notes.append(f"missed bad: {entry['prompt']!r} against {_show(list(style.items))}")
    return {"good": good, "bad_en": bad_en, "unchecked": unchecked, "states": states, "notes": notes}


def score_short(meaning: style_check.Meaning) -> dict[str, Counter]:
    """The studio's own short prompts (`short_prompts.json`), each against every ruled-out item on its own: how
    the pairs where the prompt shows the item and those where it does not end (caught, passed, unchecked)."""
    data = json.loads((LABELS / "short_prompts.json").read_text())
    ends: dict[str, Counter] = {"shows the item": Counter(), "does not show it": Counter()}
    for entry in data["prompts"]:
        for item in data["ruled_out"]:
            style = Style(items=(StyleItem(aspect=item["aspect"], words=item["words"], liked=False),))
            state = STATES[style_check.check(entry["prompt"], style, meaning).state]
            ends["shows the item" if item["words"] in entry["shows"] else "does not show it"][state] += 1
    return ends


def studio_reading(feedback: str) -> Reading:
    understood = style_reader.understand(feedback)
    return Reading(items=understood.items, source="studio", not_understood=[u.text for u in understood.not_understood])


@dataclass
class RealModel:
    """A real model over llama.cpp in a studio of its own: its Director reads feedback, its Writer's agent
    answers `check_style`."""

    read: Reader
    asker: prompt_check.Asker
    close: Callable[[], None]


def real_model(name: str) -> RealModel:
    from harness import new_data_dir, remove_data_dir

    from mas import agents
    from mas.agents.llm.agent import LLMAgent
    from tests.llm_server import GEMMA_MODEL, LocalLLM, unavailable_reason
    from tests.studio import IsolatedStudio

    if unavailable_reason():
        raise SystemExit(f"{name}: {unavailable_reason()}")
    model = GEMMA_MODEL if name == "gemma3" else None
    if model is not None and not model.exists():
        raise SystemExit(f"{name}: run bash scripts/gemma-model.sh")
    data_dir = new_data_dir(f"mas-style-{name}-")
    server = LocalLLM(data_dir / "llm", model=model, alias="gemma-3-270m" if model else "smollm2-135m-instruct").start()
    studio = IsolatedStudio(
        data_dir / "studio",
        MAS_AGENT_BACKEND="llm",
        MAS_LLM_URL=server.url,
        MAS_LLM_MODEL=server.alias,
        MAS_LLM_CONTEXT_CHARS="2000",  # as the seed-table bench: the conversation's history stays short
    ).__enter__()

    def close() -> None:
        studio.__exit__(None, None, None)
        server.stop()
        remove_data_dir(studio.settings, data_dir)

    director = agents.backend(studio.settings, STUDIO).director
    return RealModel(read=director.read_style, asker=LLMAgent(studio.settings, STUDIO, "writer"), close=close)


def report(
    readers: dict[str, dict[str, Score]], prompts: dict, *, walls: dict[str, float], askers: Sequence[str]
) -> list[str]:
    lines = [
        "| reader | feedbacks read | read by the model | liked P / R | ruled-out P / R | inversions | as labelled "
        "| not understood | disagreed with the studio's reader | unanswered |"
    ]
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for name, groups in readers.items():
        for group, score in groups.items():
            f = score.figures()
            f = {k: "none stored" if v is None else v for k, v in f.items()}
            lines.append(
                f"| {name} ({group}) | {f['feedbacks']} | {f['read by the model']} | {f['liked precision']} / "
                f"{f['liked recall']} | {f['ruled-out precision']} / {f['ruled-out recall']} | "
                f"{f['polarity inversions']} | {f['stored as labelled']} | {f['not understood']} | "
                f"{f['disagreed']} | {f['unanswered']} |"
            )
    lines += ["", "Reading wall time: " + ", ".join(f"{n} {w:.0f} s" for n, w in walls.items()), ""]
    lines += by_class(readers)
    good, bad, unchecked = prompts["good"], prompts["bad_en"], prompts["unchecked"]
    lines += [
        "| prompts | figure |",
        "|---|---|",
        f"| good English prompts refused | {good['en'][0]} of {good['en'][1]} |",
        f"| good foreign prompts refused | {good['foreign'][0]} of {good['foreign'][1]} |",
        f"| foreign prompts the studio's checks cannot read (a model checks them; without one: unchecked) | "
        f"{unchecked['foreign']} |",
        f"| English prompts left unchecked (a ruled-out item the checks are not sure of) | {unchecked['en']} |",
        f"| bad English prompts caught | {bad['any'][0]} of {bad['any'][1]} |",
        f"| ... missing a liked item: the miss found | {bad['missing'][0]} of {bad['missing'][1]} |",
        f"| ... naming a ruled-out item: found | {bad['names'][0]} of {bad['names'][1]} |",
        "",
        "How each prompt ends: without a model (caught: refused; unchecked: recorded so), and with a model asked the "
        "one `check_style` question where the checks cannot read or tell. `labelled` is a stand-in, not a model: "
        "it answers from the prompt's labels; any other column is a real model over llama.cpp.",
        "",
        "| prompts | of | "
        + " | ".join(
            "no model" if a == "none" else f"`{a}` {'stand-in ' if a == 'labelled' else ''}asked" for a in askers
        )
        + " (each: caught / passed / unchecked) |",
        "|---|---|" + "---|" * len(askers),
    ]
    for row, c in sorted(prompts["states"].items(), key=lambda rc: (rc[0].endswith("foreign"), rc[0])):
        of = sum(n for (asker, _), n in c.items() if asker == "none")
        shown = [" / ".join(str(c[asker, s]) for s in STATES.values()) for asker in askers]
        lines.append(f"| {row} | {of} | {' | '.join(shown)} |")
    return lines


def by_class(readers: dict[str, dict[str, Score]]) -> list[str]:
    """Each reader's outcomes by construction class: feedbacks stored as labelled / not understood / wrong
    (of which inverted)."""
    lines = []
    for name, groups in readers.items():
        merged: dict[str, dict[str, int]] = {}
        for score in groups.values():
            for cls, counts in score.by_class.items():
                into = merged.setdefault(cls, dict.fromkeys(OUTCOMES, 0))
                for k, v in counts.items():
                    into[k] += v
        lines += [
            f"| {name}: class | feedbacks | as labelled | not understood | wrong | of which inverted |",
            "|---|---|---|---|---|---|",
        ]
        for cls in sorted(merged, key=lambda c: (c.startswith("language"), c)):
            c = merged[cls]
            wrong = c["wrong"] + c["inverted"]
            lines.append(
                f"| {cls} | {sum(c.values())} | {c['as labelled']} | {c['not understood']} | {wrong} | {c['inverted']} |"
            )
        lines.append("")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readers", default="studio,labelled")
    parser.add_argument("--output", type=Path)
    parser.add_argument("--verbose", action="store_true", help="print every wrong reading and check")
    parser.add_argument(
        "--model-every", type=int, default=1, help="real models read every Nth feedback (a model call is seconds)"
    )
    parser.add_argument("--sweep", action="store_true", help="the prompt figures at other embedding thresholds")
    parser.add_argument(
        "--part", choices=("tune", "test"), default="test", help="tune: the only part rules may be set on"
    )
    parser.add_argument(
        "--checkers", default="", help="real models (smollm2, gemma3) asked `check_style` beside the stand-in"
    )
    args = parser.parse_args()
    feedbacks, prompts = load("feedbacks", args.part), load("prompts", args.part)
    stand_in = LabelledModel(feedbacks, prompts)
    scores, walls = {}, {}
    real: dict[str, RealModel] = {}
    try:
        for name in args.readers.split(","):
            if name == "studio":
                read: Reader = studio_reading
            elif name == "labelled":
                read = AskingDirector(stand_in).read_style
            else:
                read = real.setdefault(name, real_model(name)).read
            start = time.monotonic()
            sample = feedbacks if name in ("studio", "labelled") else feedbacks[:: args.model_every]
            scores[name] = score_reader(read, sample)
            walls[name] = time.monotonic() - start
            if args.verbose:
                for group in scores[name].values():
                    print(f"--- {name}", *group.inversions, *group.wrong, sep="\n")
        meaning = open_embedder(default_model_path(), default_cache_dir())
        askers: dict[str, prompt_check.Asker] = {"labelled": stand_in}
        for name in filter(None, args.checkers.split(",")):
            askers[name] = real.setdefault(name, real_model(name)).asker
        start = time.monotonic()
        checked = score_prompts(prompts, meaning, askers)
        walls["prompt checks"] = time.monotonic() - start
    finally:
        for model in real.values():
            model.close()
    sweep: list[str] = []
    themes: list[str] = []
    phrases: list[str] = []
    bands: list[str] = []
    if args.sweep:  # how the embedding thresholds were set: every pair, on this set's prompts
        chosen = style_check.CARRIES_SIMILARITY, style_check.NAMES_SIMILARITY
        for carries in (0.5, 0.55, 0.6, 0.62, 0.65, 0.7):
            for names in (0.6, 0.65, 0.7, 0.75, 0.8):
                style_check.CARRIES_SIMILARITY, style_check.NAMES_SIMILARITY = carries, names
                r = score_prompts(prompts, meaning, None)
                sweep.append(
                    f"| {carries} | {names} | {r['good']['en'][0]} of {r['good']['en'][1]} | "
                    f"{r['bad_en']['any'][0]} of {r['bad_en']['any'][1]} |"
                )
        style_check.CARRIES_SIMILARITY, style_check.NAMES_SIMILARITY = chosen
        theme = style_check.THEME_SIMILARITY
        for at in (0.1, 0.12, 0.14, 0.16, 0.18, 0.2, 0.25, 0.3):
            style_check.THEME_SIMILARITY = at
            r = score_prompts(prompts, meaning, None)
            themes.append(
                f"| {at} | {r['good']['en'][0]} of {r['good']['en'][1]} | {r['bad_en']['any'][0]} of {r['bad_en']['any'][1]} |"
            )
        style_check.THEME_SIMILARITY = theme
        phrase = style_check.PHRASE_SIMILARITY
        for at in (0.3, 0.4, 0.45, 0.5, 0.55, 0.6):
            style_check.PHRASE_SIMILARITY = at
            r = score_prompts(prompts, meaning, None)
            phrases.append(
                f"| {at} | {r['good']['en'][0]} of {r['good']['en'][1]} | {r['bad_en']['any'][0]} of {r['bad_en']['any'][1]} |"
            )
        style_check.PHRASE_SIMILARITY = phrase
        edges = style_check.UNSURE_SIMILARITY, style_check.ASK_SIMILARITY
        for at in (0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 1.01):  # one edge for both, with a model and without
            style_check.UNSURE_SIMILARITY = style_check.ASK_SIMILARITY = at
            r = score_prompts(prompts, meaning, {"labelled": stand_in})
            bad, good = r["states"]["bad English"], r["states"]["good English"]
            short = score_short(meaning)
            pairs = [" / ".join(str(short[k][s]) for s in STATES.values()) for k in short]
            bands.append(
                f"| {'none (before)' if at > 1 else at} | {good['none', 'caught']} | {good['none', 'unchecked']} | "
                f"{bad['none', 'caught']} / {bad['none', 'unchecked']} | {bad['labelled', 'caught']} | "
                f"{good['labelled', 'caught']} | {pairs[0]} | {pairs[1]} |"
            )
        style_check.UNSURE_SIMILARITY, style_check.ASK_SIMILARITY = edges
    if args.verbose:
        print("--- prompts", *checked["notes"], sep="\n")
    lines = [
        f"# Style understanding on the labelled set: the {args.part} part",
        "",
        f"`{command_line('bench/style_bench.py')}`: {machine()}.",
        provenance({"llama-cpp-python": LLM_VERSION}) + ".",
        f"The {args.part} part: {len(feedbacks)} feedbacks ({sum('new' in e for e in feedbacks)} of them new "
        f"test sentences), {len(prompts)} prompts (`bench/style_labels/`, split by `part`).",
        f"Real models read every {args.model_every}th feedback (a call takes seconds on 2 cores)."
        if set(scores) - {"studio", "labelled"}
        else "No real model in this run (`--readers smollm2,gemma3` reads with them).",
        "",
        *report(scores, checked, walls=walls, askers=["none", *askers]),
    ]
    if sweep:
        lines += [
            "",
            "| carries at | names at | good English refused | bad English caught |",
            "|---|---|---|---|",
            *sweep,
            "",
            "| a theme carried at | good English refused | bad English caught |",
            "|---|---|---|",
            *themes,
            "",
            "| a ruled-out phrase named at | good English refused | bad English caught |",
            "|---|---|---|",
            *phrases,
            "",
            "| not sure from | good English refused | good English unchecked | bad English caught / unchecked "
            "(no model) | bad English caught (stand-in asked) | good English refused (stand-in asked) | "
            "the studio's short prompts, pairs showing the item: caught / passed / unchecked | "
            "pairs not showing it: caught / passed / unchecked |",
            "|---|---|---|---|---|---|---|---|",
            *bands,
        ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
