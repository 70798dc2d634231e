"""Benchmark of the studio's taste learning: how well it predicts a user's A/B picks after 10, 25 and 50.

A simulated user picks the winner of each A/B test among three variations of a concept (an A/B approach of
the offline Director, a palette and a mood, and the video's graded aesthetic score). Its taste is NOT a
weight per word of the studio's lists: it likes or dislikes hidden qualities the prompts never name, the
warmth of a colour, the energy of a mood and the motion of a camera approach, with an interaction (warm
colours with energetic moods, or the reverse), and it prefers better-looking videos. The weights are drawn
anew for every seed. A consistent user (temperature 0) picks the variation of highest utility; a noisy one
samples its pick with probability softmax(utility / temperature).

Picks are stored exactly as `mas pick` stores them (with each video's scores, the `preference` axis being
the DPO adapter served when the variations were graded, so a pick's DPO feature is a prediction made before
the pick), and after 10, 25 and 50 picks the Tuner runs as the nightly job would. Measured on 200 fresh A/B
tests of concepts never trained on, for what each approach serves (its promoted version):

- DPO alone: the promoted adapter's implicit reward (`gpu.tuner`, a tiny random Llama);
- pairwise alone: the Bradley-Terry taste over the MiniLM embeddings and the per-axis scores (`mas.learning.taste`),
  fitted on picks whose scores carry no DPO axis;
- combination: the same taste fitted on picks whose scores carry the DPO axis (how the studio runs when
  an adapter is promoted).

By default the benchmark starts its own embedded PostgreSQL in a temporary folder and removes it at the
end. With --database-url it uses that server instead and EMPTIES ITS A/B, ADAPTER AND TASTE TABLES.

    python bench/learning_bench.py                 # 48 seeds x 2 users, checkpoints 10 25 50, 200 test choices
    python bench/learning_bench.py --seeds 1 --temperatures 0 --test-choices 50     # a quick look
    python bench/learning_bench.py --checkpoints 10 25 50 100   # the curve past the goals' 50 picks (twice as long)
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import random
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

import numpy as np
import sqlalchemy as sa
from harness import ROOT, command_line, machine, new_data_dir, remove_data_dir
from sklearn.linear_model import LogisticRegression

from gpu.preference_model import PROMPT_TEMPLATE, PreferenceModel, promoted_adapter
from gpu.tuner import tune
from mas import db
from mas.agents.roles import Plan, PlannedVideo
from mas.agents.studio_rules import AB_APPROACHES
from mas.config import Settings
from mas.db import session_scope
from mas.domain.identity import Actor
from mas.learning.ab_design import offer
from mas.learning.promotion import served, tune_taste
from mas.learning.taste import Option
from mas.models import ABSelection, ABTest
from tests.integration.test_tuner import TINY, build_tiny_lm

WARMTH = {"crimson": 0.9, "orange": 1.0, "amber": 0.8, "gold": 0.6, "silver": -0.3, "purple": -0.4,
          "emerald": -0.6, "teal": -0.9}
"""How warm each palette is: a quality of the colour that no prompt names."""
ENERGY = {"epic": 1.0, "cheerful": 0.6, "gritty": 0.5, "whimsical": 0.2, "moody": -0.3, "dreamy": -0.5,
          "melancholic": -0.7, "serene": -0.9}
"""How energetic each mood is."""
MOTION = dict(zip(AB_APPROACHES, (0.2, -0.6, 0.9, -1.0, 0.6, -0.4)))
"""How much each camera approach moves."""
COLOURS, MOODS = tuple(WARMTH), tuple(ENERGY)
TRAIN_CONCEPTS = tuple(f"a {c}" for c in (
    "dragon", "phoenix", "kraken", "griffin", "unicorn", "golem", "wyvern", "sphinx",
    "lighthouse", "forest spirit", "desert caravan", "clockwork city", "glacier", "coral reef", "night market", "comet",
))
TEST_CONCEPTS = tuple(f"a {c}" for c in (
    "hydra", "centaur", "basilisk", "volcano", "mountain monastery", "storm at sea", "floating island", "robot",
))
CONFIG = TINY
"""The tests' settings for the tiny model: a real base model wants the defaults (learning rate 5e-5, ...)."""
GOAL_PICKS = 50
"""The issue's goals are set after this many picks; later checkpoints show how the curve goes on."""
APPROACHES = ("DPO alone", "pairwise alone", "combination", "pairwise, no A/B design")
PAIRWISE_USER, COMBINED_USER, UNDESIGNED_USER = "bench-pairwise", "bench-combined", "bench-undesigned"


@dataclass(frozen=True)
class Variation:
    concept: str
    approach: str
    colour: str
    mood: str
    aesthetic: float

    @property
    def prompt(self) -> str:
        return f"{self.concept}, {self.approach}, {self.colour} palette, {self.mood} atmosphere"


@dataclass(frozen=True)
class SimulatedUser:
    """A hidden taste over qualities the prompts never name: warmth, energy, their product, motion, looks."""

    warmth: float
    energy: float
    together: float
    motion: float
    looks: float
    temperature: float

    @classmethod
    def draw(cls, rng: random.Random, *, temperature: float) -> SimulatedUser:
        return cls(*(rng.gauss(0, 1) for _ in range(4)), looks=abs(rng.gauss(0, 1)), temperature=temperature)

    @staticmethod
    def qualities(v: Variation) -> list[float]:
        """What the utility is made of, none of it named in a prompt: warmth, energy, their product, motion,
        and the looks (the aesthetic score, centred)."""
        w, e = WARMTH[v.colour], ENERGY[v.mood]
        return [w, e, w * e, MOTION[v.approach], v.aesthetic - 0.5]

    def utility(self, v: Variation) -> float:
        weights = (self.warmth, self.energy, self.together, self.motion, self.looks * 4)
        return sum(weight * quality for weight, quality in zip(weights, self.qualities(v)))

    def pick(self, rng: random.Random, options: list[Variation]) -> int:
        """Index of the variation the user picks: the best, or sampled with softmax(utility / temperature)."""
        scores = [self.utility(o) for o in options]
        if self.temperature <= 0:
            return max(range(len(options)), key=scores.__getitem__)
        top = max(scores)
        odds = [math.exp((s - top) / self.temperature) for s in scores]
        return rng.choices(range(len(options)), weights=odds)[0]


@dataclass
class ABCase:
    """One A/B test: its variations, the user's pick, and the DPO axis of each when it was graded."""

    concept: str
    variations: list[Variation]
    chosen: int
    preference: list[float] | None = None

    def options(self, *, with_preference: bool) -> list[Option]:
        out = []
        for i, v in enumerate(self.variations):
            scores = {"aesthetic": v.aesthetic}
            if with_preference and self.preference is not None:
                scores["preference"] = self.preference[i]
            out.append(Option(prompt=v.prompt, scores=scores))
        return out


def draw_variations(rng: random.Random, concept: str, count: int) -> list[Variation]:
    """`count` distinct variations of `concept`, at random (what a Director might propose)."""
    options: list[Variation] = []
    while len(options) < count:
        v = Variation(concept, rng.choice(AB_APPROACHES), rng.choice(COLOURS), rng.choice(MOODS),
                      round(rng.uniform(0.3, 0.9), 3))
        if all((v.approach, v.colour, v.mood) != (o.approach, o.colour, o.mood) for o in options):
            options.append(v)
    return options


def ab_case(rng: random.Random, user: SimulatedUser, concepts: tuple[str, ...], variations: int) -> ABCase:
    """A test A/B test: random variations of a random concept, and the user's pick."""
    concept = rng.choice(concepts)
    options = draw_variations(rng, concept, variations)
    return ABCase(concept, options, user.pick(rng, options))


def designed_cases(rng: random.Random, undesigned_rng: random.Random, user: SimulatedUser, settings: Settings,
                   actor: Actor, *, variations: int) -> tuple[ABCase, ABCase]:
    """A training A/B test as the studio makes one, and the same without the design. The Director proposes
    `variations * settings.ab.proposals` variations; `mas.learning.ab_design.offer` shows `variations` of them, chosen
    on `actor`'s picks so far (`settings.ab.explore` of them at random). Without the design, the first
    proposals are shown (random ones); that user's picks are drawn from their own generator, so the studio's
    arm is the same with or without it."""
    concept = rng.choice(TRAIN_CONCEPTS)
    proposals = draw_variations(rng, concept, variations * settings.ab.proposals)
    by_approach = {v.prompt.removeprefix(f"{concept}, "): v for v in proposals}
    plan = Plan(videos=[PlannedVideo(concept=concept, approach=a) for a in by_approach])
    shown = [by_approach[v.approach] for v in offer(plan, count=variations, settings=settings, actor=actor).videos]
    first = proposals[:variations]
    return ABCase(concept, shown, user.pick(rng, shown)), ABCase(concept, first, user.pick(undesigned_rng, first))


def grade_preference(settings: Settings, base: Path, cases: list[ABCase]) -> None:
    """The DPO axis of each variation as grading would give it now: sigmoid of the served adapter's reward."""
    adapter = promoted_adapter(settings, Actor(COMBINED_USER), base=base)
    if adapter is None:
        return
    model = PreferenceModel.load(base=base, adapter=adapter.path)
    rewards = model.rewards([(c.concept, v.prompt) for c in cases for v in c.variations]).tolist()
    at = 0
    for c in cases:
        c.preference = [1 / (1 + math.exp(-r)) for r in rewards[at: at + len(c.variations)]]
        at += len(c.variations)


def record(settings: Settings, actor: Actor, cases: list[ABCase], *, with_preference: bool) -> None:
    """Store the picks as `mas pick` does: a closed A/B test and one pick row (chosen vs rejected) each."""
    with session_scope(settings) as session:
        for case in cases:
            options = case.options(with_preference=with_preference)
            label = chr(ord("A") + case.chosen)
            test = ABTest(concept=case.concept, status="closed", winner_label=label, user_name=actor.user)
            session.add(test)
            session.flush()
            rejected = [o for i, o in enumerate(options) if i != case.chosen]
            session.add(ABSelection(
                test_id=test.id, chosen_label=label, chosen_prompt=options[case.chosen].prompt,
                chosen_scores=dict(options[case.chosen].scores), rejected_prompts=[o.prompt for o in rejected],
                rejected_scores=[dict(o.scores) for o in rejected], concept=case.concept, user_name=actor.user,
            ))


@dataclass
class Accuracy:
    pairwise: float
    top1: float
    calibration_error: float | None = None


def accuracy(scores: list[list[float]], cases: list[ABCase], probabilities: list[list[float]] | None = None) -> Accuracy:
    """Pairwise (chosen scored above each rejected; chance 1/2) and top-1 (best-scored is the pick; chance
    1/variations); with pair probabilities, the expected calibration error over 10 bins."""
    right = pairs = top1 = 0
    for s, case in zip(scores, cases):
        right += sum(s[case.chosen] > s[i] for i in range(len(s)) if i != case.chosen)
        pairs += len(s) - 1
        top1 += max(range(len(s)), key=s.__getitem__) == case.chosen
    error = None
    if probabilities is not None:
        predicted, happened = [], []
        for p, case in zip(probabilities, cases):
            for i in range(len(p)):
                for j in range(len(p)):
                    if i != j and case.chosen in (i, j):
                        predicted.append(p[i] / (p[i] + p[j]))
                        happened.append(float(case.chosen == i))
        predicted, happened = np.asarray(predicted), np.asarray(happened)
        bins = np.minimum((predicted * 10).astype(int), 9)
        error = float(sum(abs(predicted[bins == b].mean() - happened[bins == b].mean()) * (bins == b).sum()
                          for b in range(10) if (bins == b).any()) / len(predicted))
    return Accuracy(right / pairs, top1 / len(cases), error)


def hidden_qualities_reference(trained: list[ABCase], tests: list[ABCase]) -> Accuracy:
    """A learner given the user's hidden qualities as its features (`SimulatedUser.qualities`), fitted on the
    same picks: a reference for what those picks can teach with the right features. Not a studio model: no
    studio can know these qualities. Pairwise logistic regression over the five qualities, each pick's pairs
    read both ways (no intercept), lightly regularised (C = 10) so a consistent user's separable picks keep
    finite weights."""
    diffs = np.asarray([np.subtract(SimulatedUser.qualities(c.variations[c.chosen]), SimulatedUser.qualities(v))
                        for c in trained for i, v in enumerate(c.variations) if i != c.chosen])
    model = LogisticRegression(C=10.0, fit_intercept=False, max_iter=1000)
    model.fit(np.vstack([diffs, -diffs]), np.r_[np.ones(len(diffs)), np.zeros(len(diffs))])
    weights = model.coef_[0]
    return accuracy([[float(weights @ SimulatedUser.qualities(v)) for v in c.variations] for c in tests], tests)


def measure_taste(settings: Settings, actor: Actor, cases: list[ABCase], *, with_preference: bool) -> Accuracy | None:
    current = served(settings, actor)
    if current.version is None:
        return None
    probabilities = [current.taste.choice_probabilities(c.options(with_preference=with_preference), settings=settings)
                     for c in cases]
    return accuracy(probabilities, cases, probabilities)


def measure_dpo(settings: Settings, base: Path, cases: list[ABCase]) -> Accuracy | None:
    adapter = promoted_adapter(settings, Actor(COMBINED_USER), base=base)
    if adapter is None:
        return None
    model = PreferenceModel.load(base=base, adapter=adapter.path)
    rewards = model.rewards([(c.concept, v.prompt) for c in cases for v in c.variations]).tolist()
    scores, at = [], 0
    for c in cases:
        scores.append(rewards[at: at + len(c.variations)])
        at += len(c.variations)
    return accuracy(scores, cases)


def reset(settings: Settings) -> None:
    with db.ready_engine(settings).begin() as conn:
        conn.execute(sa.text("truncate ab_selections, ab_tests, trained_adapters, taste_models restart identity cascade"))


@dataclass
class Row:
    temperature: float
    seed: int
    choices: int
    served: dict[str, Accuracy | None] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    interaction: bool = False
    """Whether the combination's served taste has an interaction between phrases."""
    ceiling: Accuracy | None = None
    """The user's own utility scoring the test set: what a perfect learner would reach (below 100% for a
    noisy user, whose picks are partly chance)."""
    reference: Accuracy | None = None
    """`hidden_qualities_reference` on the designed picks so far."""


def run_seed(settings: Settings, base: Path, *, seed: int, temperature: float, args: argparse.Namespace) -> list[Row]:
    rng = random.Random(seed)
    user = SimulatedUser.draw(rng, temperature=temperature)
    test_set = [ab_case(rng, user, TEST_CONCEPTS, args.variations) for _ in range(args.test_choices)]
    reset(settings)
    pairwise_user, combined_user = Actor(PAIRWISE_USER), Actor(COMBINED_USER)
    undesigned_user, undesigned_rng = Actor(UNDESIGNED_USER), random.Random(f"undesigned {seed}")
    rows, made, design_seconds, designed = [], 0, [], []
    for checkpoint in sorted(args.checkpoints):
        cases = []
        for _ in range(checkpoint - made):  # one at a time: each A/B test is designed on the picks before it
            started = time.perf_counter()
            case, undesigned = designed_cases(rng, undesigned_rng, user, settings, pairwise_user, variations=args.variations)
            design_seconds.append(time.perf_counter() - started)
            cases.append(case)
            record(settings, pairwise_user, [case], with_preference=False)
            record(settings, undesigned_user, [undesigned], with_preference=False)
        designed += cases
        grade_preference(settings, base, cases)  # graded by the adapter served before these picks
        record(settings, combined_user, cases, with_preference=True)
        made = checkpoint
        row = Row(temperature, seed, checkpoint,
                  ceiling=accuracy([[user.utility(v) for v in c.variations] for c in test_set], test_set),
                  reference=hidden_qualities_reference(designed, test_set))
        started = time.perf_counter()
        report = tune(settings, combined_user, config=CONFIG)  # the DPO adapter and the combined taste
        row.seconds["combined tune"] = time.perf_counter() - started
        started = time.perf_counter()
        pairwise = tune_taste(settings, pairwise_user)
        row.seconds["pairwise tune"] = time.perf_counter() - started
        row.seconds["A/B design"] = statistics.mean(design_seconds)
        undesigned = tune_taste(settings, undesigned_user)
        row.reasons = {"DPO alone": report.reason, "combination": report.taste.reason if report.taste else "",
                       "pairwise alone": pairwise.reason, "pairwise, no A/B design": undesigned.reason}
        row.interaction = served(settings, combined_user).taste.latents is not None
        grade_preference(settings, base, test_set)
        row.served = {
            "DPO alone": measure_dpo(settings, base, test_set),
            "pairwise alone": measure_taste(settings, pairwise_user, test_set, with_preference=False),
            "combination": measure_taste(settings, combined_user, test_set, with_preference=True),
            "pairwise, no A/B design": measure_taste(settings, undesigned_user, test_set, with_preference=False),
        }
        rows.append(row)
        print(f"temperature {temperature} seed {seed} after {checkpoint} picks: " + "; ".join(
            f"{k} {'none served' if a is None else f'{a.pairwise:.1%} pairwise, {a.top1:.1%} top-1'}"
            for k, a in row.served.items()) + f"; hidden-qualities reference {row.reference.pairwise:.1%} pairwise",
            flush=True)
    return rows


def mean_sd(values: list[float | None]) -> str:
    """Mean ± standard deviation of the known values, saying how many are known when some are not."""
    known = [v for v in values if v is not None]
    if not known:
        return "n/a"
    text = f"{known[0]:.1%}" if len(known) == 1 else f"{statistics.mean(known):.1%} ± {statistics.stdev(known):.1%}"
    return text if len(known) == len(values) else f"{text} ({len(known)} of {len(values)})"


def report(rows: list[Row], args: argparse.Namespace, *, command: str, seconds: float) -> str:
    out = [
        "# Learning benchmark: predicting a user's A/B picks\n",
        f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        f"- command: `{command}`",
        f"- machine: {machine()}; no GPU used (peft + trl path)",
        "- load average (1/5/15 min) at the end: {:.2f} / {:.2f} / {:.2f}".format(*os.getloadavg()),
        f"- software: Python {platform.python_version()}, torch {version('torch')}, transformers "
        f"{version('transformers')}, trl {version('trl')}, peft {version('peft')}, scikit-learn {version('scikit-learn')}",
        "- user: utility = a·warmth(colour) + b·energy(mood) + c·warmth·energy + d·motion(approach) + "
        "4|e|·(aesthetic − 0.5), a..e ~ N(0, 1) drawn per seed; warmth, energy and motion are never named in a "
        f"prompt; {args.variations} variations per A/B test, aesthetic score U(0.3, 0.9)",
        f"- training A/B tests: the Director proposes {args.variations * args.proposals} random variations and "
        f"the test shows {args.variations}: {args.explore} drawn at random among the others (`MAS_AB_EXPLORE`), the "
        "rest those whose pick teaches the taste most on the picks so far and the taste serving the user "
        "(`mas.learning.ab_design`, as the studio does); `pairwise, no A/B design` is the pairwise taste of the same user "
        "shown the first proposals instead (random variations), on the same proposals",
        f"- training: {len(TRAIN_CONCEPTS)} concepts; test: {args.test_choices} fresh A/B tests of "
        f"{len(TEST_CONCEPTS)} other concepts, the same for every checkpoint of a seed; {args.seeds} seeds per user",
        "- DPO: tiny random Llama (hidden 64, 2 layers), word-level tokenizer trained on the prompt vocabulary; "
        "LoRA r=8, β=0.1, lr 5e-3, 8 epochs. Pairwise: sum of the all-MiniLM-L6-v2 embeddings of the prompt's "
        "phrases + a weight of each phrase's own (hashed) + per-axis scores, L2 logistic regression, strength by "
        "cross-validation over picks, plus a rank-1 interaction between the phrases after the subject "
        "(factorisation machine over each phrase's own value, fitted together with the sum) kept when "
        "cross-validation prefers it, Platt-scaled",
        "- promotion: the pairwise taste is fitted on every pick and judged on its cross-validated predictions "
        "(against the default: every pick; against the version serving: the picks since it was fitted; "
        "`mas.learning.promotion`); DPO adapters are trained without every 4th pick and judged on those. What is "
        "measured is what each approach serves (its promoted version)",
        f"\nPairwise: the chosen variation scored above a rejected one (chance 50%). Top-1: the best-scored of the "
        f"{args.variations} variations is the user's pick (chance {1 / args.variations:.0%}). Calibration error: "
        "expected calibration error of the served taste's pair probabilities over 10 bins (0 is perfectly "
        "calibrated). Mean ± standard deviation over seeds; `(k of n)`: only k seeds had a version promoted.",
    ]
    for temperature in args.temperatures:
        kind = "consistent user (always picks its favourite)" if temperature <= 0 else (
            f"noisy user (picks with softmax(utility / {temperature}))")
        out += [f"\n## {kind}\n",
                "| picks | approach | pairwise | top-1 | calibration error |", "|---|---|---|---|---|"]
        for checkpoint in sorted(args.checkpoints):
            at = [r for r in rows if r.choices == checkpoint and r.temperature == temperature]
            for name in APPROACHES:
                got = [r.served[name] for r in at]
                out.append(
                    f"| {checkpoint} | {name} | {mean_sd([a and a.pairwise for a in got])} "
                    f"| {mean_sd([a and a.top1 for a in got])} "
                    f"| {mean_sd([a and a.calibration_error for a in got]) if name != 'DPO alone' else '-'} |"
                )
        ceilings = [r.ceiling for r in rows if r.temperature == temperature and r.choices == max(args.checkpoints)]
        out.append(f"\nThe user's own utility predicts these test picks {mean_sd([c.pairwise for c in ceilings])} "
                   f"pairwise and {mean_sd([c.top1 for c in ceilings])} top-1: no model can do better.")
        reached = ", ".join(
            f"{mean_sd([r.reference.pairwise for r in rows if r.temperature == temperature and r.choices == c])} "
            f"pairwise after {c}" for c in sorted(args.checkpoints))
        out.append("\nA learner given the user's hidden qualities as features (warmth, energy, their product, motion, "
                   "looks: what no prompt names and no studio can know), fitted on the same designed picks, reaches "
                   f"{reached}: about what these picks can teach with the right features; the gap to it is the price "
                   "of learning the qualities from the prompts' words.")
    judged = GOAL_PICKS if GOAL_PICKS in args.checkpoints else max(args.checkpoints)
    when = f"after {judged} picks" + ("" if judged == GOAL_PICKS else f"; the goals are set after {GOAL_PICKS}")
    out += [f"\n## Goals ({when}, what the studio serves: the combination; where the "
            "default still serves, it counts as a guess: 50% pairwise, 1 in 3 top-1)\n"]
    for label, temperature, metric, goal in (("consistent user, pairwise", 0.0, "pairwise", 0.90),
                                             ("noisy user (0.5), pairwise", 0.5, "pairwise", 0.80),
                                             ("consistent user, top-1", 0.0, "top1", 0.80)):
        chance = {"pairwise": 0.5, "top1": 1 / args.variations}[metric]  # the default expects nothing: a guess
        got = [getattr(r.served["combination"], metric) if r.served["combination"] else chance
               for r in rows if r.choices == judged and r.temperature == temperature]
        if got:
            mean = statistics.mean(got)
            error = (f" ± {statistics.stdev(got) / math.sqrt(len(got)):.1%} standard error over {len(got)} seeds"
                     if len(got) > 1 else " (one seed)")
            out.append(f"- {label}: {mean:.1%}{error} (goal {goal:.0%}: {'met' if mean >= goal else 'NOT met'})")
    out.append("\n## What the A/B design gains (the pairwise taste, with it minus without it, paired by seed)\n")
    for temperature in args.temperatures:
        for checkpoint in sorted(args.checkpoints):
            at = [r for r in rows if r.choices == checkpoint and r.temperature == temperature]
            gains = {metric: [getattr(r.served["pairwise alone"], metric) - getattr(r.served["pairwise, no A/B design"], metric)
                              for r in at if r.served["pairwise alone"] and r.served["pairwise, no A/B design"]]
                     for metric in ("pairwise", "top1")}
            if len(gains["pairwise"]) > 1:
                out.append(f"- T={temperature}, {checkpoint} picks ({len(gains['pairwise'])} seeds with both served): "
                           + "; ".join(f"{metric} {statistics.mean(g):+.1%} ± {statistics.stdev(g) / math.sqrt(len(g)):.1%}"
                                       for metric, g in gains.items()) + " (mean ± standard error)")
    mean_tune = statistics.mean(r.seconds["pairwise tune"] for r in rows)
    mean_design = statistics.mean(r.seconds["A/B design"] for r in rows)
    out += ["\n## Reading these figures\n",
            "- The test concepts never appear in training, so what carries over is the taste for warmth, energy, "
            "motion and looks, learned from the embeddings of words that carry them and from the scores.",
            "- DPO learns from the prompt text only, on a base model that knows no language; the pairwise taste "
            "starts from MiniLM's knowledge of words and also sees the scores. The combination is the pairwise "
            "taste with the DPO axis as one more feature, weighted by what it earned on the picks.",
            f"- A pairwise tune (fit with cross-validation, judge, store) took {mean_tune:.2f} s on average here, "
            "embeddings included.",
            f"- Choosing which variations to show (`mas.learning.ab_design.offer`: the user's picks read, their features and "
            f"the proposals' computed) took {mean_design:.2f} s per A/B test on average, on the CPU.",
            "\n## Users served an interaction between phrases (the combination)\n"]
    for temperature in args.temperatures:
        for checkpoint in sorted(args.checkpoints):
            at = [r for r in rows if r.choices == checkpoint and r.temperature == temperature]
            out.append(f"- T={temperature}, {checkpoint} picks: {sum(r.interaction for r in at)} of {len(at)} (seeds "
                       f"{', '.join(str(r.seed) for r in at if r.interaction) or 'none'})")
    out.append("\n## Promotion decisions (last seed of each user)\n")
    for temperature in args.temperatures:
        last = [r for r in rows if r.temperature == temperature and r.seed == args.seeds - 1]
        for r in last:
            for name, reason in r.reasons.items():
                out.append(f"- T={temperature}, {r.choices} picks, {name}: {reason}")
    out.append(f"\nTotal benchmark time: {seconds / 60:.1f} min.")
    return "\n".join(out) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoints", type=int, nargs="+", default=[10, 25, 50],
                        help="numbers of choices after which `tune` runs (default: 10 25 50)")
    parser.add_argument("--seeds", type=int, default=48,
                        help="tastes simulated per user kind, one per seed (default: 48; with 16, the noisy user's mean "
                        "was uncertain by two points, more than its distance to the goal)")
    parser.add_argument("--test-choices", type=int, default=200, help="fresh A/B tests measured (default: 200)")
    parser.add_argument("--variations", type=int, default=3, help="variations per A/B test (default: 3)")
    parser.add_argument("--proposals", type=int, default=None,
                        help="variations proposed per one shown (default: the studio's MAS_AB_PROPOSALS)")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.5],
                        help="user kinds: 0 always picks its favourite, > 0 picks by softmax (default: 0 0.5)")
    parser.add_argument("--database-url", default=None,
                        help="PostgreSQL to use instead of a temporary embedded one (its A/B tables are EMPTIED)")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "RESULTS-learning.md",
                        help="markdown report to write (default: bench/RESULTS-learning.md)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped run still stops its PostgreSQL
    command = command_line(__file__)
    data_dir = new_data_dir("mas-learning-bench-")
    texts = [PROMPT_TEMPLATE.format(concept=c) for c in TRAIN_CONCEPTS + TEST_CONCEPTS]
    texts += [Variation("", a, c, m, 0.5).prompt for a in AB_APPROACHES for c in COLOURS for m in MOODS]
    base = build_tiny_lm(data_dir / "tiny-llama", texts=texts)
    settings = Settings(data_dir=data_dir, database_url=args.database_url, preference_base_model_path=base,
                        min_preference_pairs=8, **({"ab_proposals": args.proposals} if args.proposals else {}))
    args.proposals, args.explore = settings.ab.proposals, settings.ab.explore  # the report says how they were shown
    started = time.perf_counter()
    try:
        db.find(settings)  # this process's database, found once as a studio process finds it
        rows = [row for temperature in args.temperatures for seed in range(args.seeds)
                for row in run_seed(settings, base, seed=seed, temperature=temperature, args=args)]
        args.output.write_text(report(rows, args, command=command, seconds=time.perf_counter() - started))
        print(f"\nwrote {args.output}")
    finally:
        remove_data_dir(settings, data_dir)


if __name__ == "__main__":
    main()
