"""Benchmark of the Tuner: how well the studio predicts a user's A/B choices after 10, 25 and 50 of them.

A simulated user with a hidden taste picks the winner of each A/B test among three variations of a concept
(the offline Director's A/B approaches, a palette and a mood). The taste is a random weight per approach,
colour and mood, drawn anew for every seed. A consistent user (temperature 0) picks the variation of highest
total weight; a noisy one samples its pick with probability softmax(weight / temperature), as real people
are not always consistent. Choices are stored exactly as `mas pick` stores them,
and `gpu.tuner.tune` runs after 10, 25 and 50 choices as the nightly job would: it trains a DPO LoRA adapter
on every choice so far, judges it on its held-out choices and promotes it or not. The adapter the studio
then serves (the promoted one) is measured on fresh choices among concepts no adapter has seen.

The base model is a tiny random Llama (hidden size 64) with a tokenizer trained on the prompt vocabulary,
built here because no weights can be downloaded: the figures measure the learning loop (data, DPO,
held-out promotion, implicit-reward scoring), not the prior knowledge a real language model brings.

By default the benchmark starts its own embedded PostgreSQL in a temporary folder and removes it at the
end. With --database-url it uses that server instead and EMPTIES ITS A/B AND ADAPTER TABLES.

    python bench/learning_bench.py                 # 4 seeds x 2 users, checkpoints 10 25 50, 200 test choices
    python bench/learning_bench.py --seeds 1 --temperatures 0 --test-choices 50     # a quick look
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
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path

import sqlalchemy as sa

from harness import ROOT, command_line, machine, new_data_dir, remove_data_dir

from gpu.preference_model import PROMPT_TEMPLATE, PreferenceModel, promoted_adapter  # noqa: E402
from gpu.tuner import tune  # noqa: E402
from mas import db  # noqa: E402
from mas.agents.offline import AB_APPROACHES  # noqa: E402
from mas.config import Settings  # noqa: E402
from mas.db import session_scope  # noqa: E402
from mas.models import ABSelection, ABTest  # noqa: E402
from tests.test_tuner import TINY, build_tiny_lm  # noqa: E402

COLOURS = ("purple", "teal", "orange", "gold", "crimson", "silver", "emerald", "amber")
MOODS = ("moody", "serene", "cheerful", "gritty", "dreamy", "epic", "melancholic", "whimsical")
TRAIN_CONCEPTS = tuple(f"a {c}" for c in (
    "dragon", "phoenix", "kraken", "griffin", "unicorn", "golem", "wyvern", "sphinx",
    "lighthouse", "forest spirit", "desert caravan", "clockwork city", "glacier", "coral reef", "night market", "comet",
))
TEST_CONCEPTS = tuple(f"a {c}" for c in (
    "hydra", "centaur", "basilisk", "volcano", "mountain monastery", "storm at sea", "floating island", "robot",
))
CONFIG = TINY
"""The tests' settings for the tiny model: a real base model wants the defaults (learning rate 5e-5, ...)."""


@dataclass(frozen=True)
class SimulatedUser:
    """A hidden taste: a weight per approach, colour and mood; a variation is worth the sum of its three."""

    weights: dict[str, float]
    temperature: float

    @classmethod
    def draw(cls, rng: random.Random, *, temperature: float) -> "SimulatedUser":
        return cls({item: rng.gauss(0, 1) for item in (*AB_APPROACHES, *COLOURS, *MOODS)}, temperature)

    def utility(self, parts: tuple[str, str, str]) -> float:
        return sum(self.weights[p] for p in parts)

    def pick(self, rng: random.Random, options: list[tuple[str, str, str]]) -> int:
        """Index of the variation the user picks: the best, or sampled with softmax(utility / temperature)."""
        scores = [self.utility(o) for o in options]
        if self.temperature <= 0:
            return max(range(len(options)), key=scores.__getitem__)
        top = max(scores)
        odds = [math.exp((s - top) / self.temperature) for s in scores]
        return rng.choices(range(len(options)), weights=odds)[0]


def prompt_of(concept: str, parts: tuple[str, str, str]) -> str:
    approach, colour, mood = parts
    return f"{concept}, {approach}, {colour} palette, {mood} atmosphere"


def ab_test(
    rng: random.Random, user: SimulatedUser, concepts: tuple[str, ...], variations: int
) -> tuple[str, list[str], int]:
    """(concept, variation prompts, index of the user's pick) for one A/B test with distinct variations."""
    concept = rng.choice(concepts)
    options: list[tuple[str, str, str]] = []
    while len(options) < variations:
        parts = (rng.choice(AB_APPROACHES), rng.choice(COLOURS), rng.choice(MOODS))
        if parts not in options:
            options.append(parts)
    return concept, [prompt_of(concept, o) for o in options], user.pick(rng, options)


def record(settings: Settings, tests: list[tuple[str, list[str], int]]) -> None:
    """Store the picks as `mas pick` does: a closed A/B test and one selection row (chosen vs rejected) each."""
    with session_scope(settings) as session:
        for concept, prompts, chosen in tests:
            test = ABTest(concept=concept, status="closed", winner_label=chr(ord("A") + chosen))
            session.add(test)
            session.flush()
            session.add(ABSelection(
                test_id=test.id, chosen_label=chr(ord("A") + chosen), chosen_prompt=prompts[chosen],
                rejected_prompts=[p for i, p in enumerate(prompts) if i != chosen], concept=concept,
            ))


def measure(model: PreferenceModel, tests: list[tuple[str, list[str], int]]) -> tuple[float, float]:
    """(pairwise accuracy, top-1 accuracy): chosen vs each rejected prompt (chance 1/2), and the best-scored
    variation being the one the user picked (chance 1/variations)."""
    rewards = model.rewards([(concept, p) for concept, prompts, _ in tests for p in prompts])
    pairs_right = pairs = top1 = 0
    at = 0
    for _, prompts, chosen in tests:
        r = rewards[at : at + len(prompts)].tolist()
        at += len(prompts)
        pairs_right += sum(r[chosen] > r[i] for i in range(len(prompts)) if i != chosen)
        pairs += len(prompts) - 1
        top1 += max(range(len(prompts)), key=r.__getitem__) == chosen
    return pairs_right / pairs, top1 / len(tests)


def reset(settings: Settings) -> None:
    with db.ready_engine(settings).begin() as conn:
        conn.execute(sa.text("truncate ab_selections, ab_tests, trained_adapters restart identity cascade"))


@dataclass
class Row:
    temperature: float
    seed: int
    choices: int
    version: int | None
    promoted: bool
    train_pairs: int
    heldout_pairs: int
    heldout_accuracy: float | None
    served_version: int | None
    pairwise: float | None
    top1: float | None
    latest_pairwise: float | None
    train_seconds: float


def run_seed(settings: Settings, base: Path, *, seed: int, temperature: float, args: argparse.Namespace) -> list[Row]:
    rng = random.Random(seed)
    user = SimulatedUser.draw(rng, temperature=temperature)
    test_set = [ab_test(rng, user, TEST_CONCEPTS, args.variations) for _ in range(args.test_choices)]
    reset(settings)
    rows, made = [], 0
    for checkpoint in sorted(args.checkpoints):
        record(settings, [ab_test(rng, user, TRAIN_CONCEPTS, args.variations) for _ in range(checkpoint - made)])
        made = checkpoint
        started = time.perf_counter()
        report = tune(settings, config=CONFIG)
        seconds = time.perf_counter() - started
        served = promoted_adapter(settings, base=base)
        pairwise = top1 = latest = None
        if served is not None:
            pairwise, top1 = measure(PreferenceModel.load(base=base, adapter=served.path), test_set)
        if report.trained:
            latest = pairwise if served is not None and served.version == report.version else measure(
                PreferenceModel.load(base=base, adapter=Path(report.path)), test_set)[0]
        rows.append(Row(temperature, seed, checkpoint, report.version, report.promoted, report.train_pairs,
                        report.heldout_pairs,
                        report.heldout_accuracy, served and served.version, pairwise, top1, latest, seconds))
        print(f"temperature {temperature} seed {seed} after {checkpoint} choices: {report.reason} "
              f"served pairwise {pairwise} top-1 {top1} "
              f"({seconds:.1f} s)", flush=True)
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
        "# Learning benchmark: predicting a user's A/B choices\n",
        f"- date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- command: `{command}`",
        f"- machine: {machine()}; no GPU used (peft + trl path)",
        "- load average (1/5/15 min) at the end: {:.2f} / {:.2f} / {:.2f}; tune times include it".format(
            *os.getloadavg()),
        f"- software: Python {platform.python_version()}, torch {version('torch')}, transformers "
        f"{version('transformers')}, trl {version('trl')}, peft {version('peft')}",
        f"- user: hidden taste = N(0, 1) weight per A/B approach ({len(AB_APPROACHES)}), colour ({len(COLOURS)}) "
        f"and mood ({len(MOODS)}), new for each seed; {args.variations} variations per A/B test",
        f"- training: {len(TRAIN_CONCEPTS)} concepts; test: {args.test_choices} fresh A/B tests of "
        f"{len(TEST_CONCEPTS)} other concepts, the same for every checkpoint of a seed; {args.seeds} seeds per user",
        "- base model: tiny random Llama (hidden 64, 2 layers) with a word-level tokenizer trained on the prompt "
        "vocabulary; LoRA r=8 on all linear layers, DPO β=0.1, lr 5e-3, 8 epochs, batch 8",
        f"- one choice = one A/B test = {args.variations - 1} DPO pairs (chosen vs each rejected); every 4th "
        "choice is held out by `tune` to decide promotion",
        "\nPairwise: the chosen variation gets a higher implicit reward than a rejected one (chance 50%). "
        f"Top-1: the best-scored of the {args.variations} variations is the one the user picked "
        f"(chance {1 / args.variations:.0%}). Served: the promoted adapter, which grading uses. Latest: the "
        "adapter trained at that checkpoint, promoted or not. Mean ± standard deviation over seeds.",
    ]
    for temperature in args.temperatures:
        kind = "consistent user (always picks its favourite)" if temperature <= 0 else (
            f"noisy user (picks with softmax(utility / {temperature}))")
        out += [
            f"\n## Held-out prediction accuracy, {kind}\n",
            "| choices so far | pairs trained on | held-out pairs (promotion) | promoted at this run | served pairwise "
            "| served top-1 | latest trained, pairwise | tune time |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for checkpoint in sorted(args.checkpoints):
            at = [r for r in rows if r.choices == checkpoint and r.temperature == temperature]
            out.append(
                f"| {checkpoint} | {statistics.mean(r.train_pairs for r in at):.0f} "
                f"| {statistics.mean(r.heldout_pairs for r in at):.0f} "
                f"| {sum(r.promoted for r in at)} of {len(at)} | {mean_sd([r.pairwise for r in at])} "
                f"| {mean_sd([r.top1 for r in at])} | {mean_sd([r.latest_pairwise for r in at])} "
                f"| {statistics.mean(r.train_seconds for r in at):.1f} s |"
            )
    out += [
        "\n## Reading these figures\n",
        f"- Chance is 50% pairwise and {1 / args.variations:.0%} top-1; a user who always picks its favourite "
        "can be predicted perfectly in principle, a noisy one cannot (its own picks disagree with its taste).",
        "- The test concepts never appear in training, so what carries over is the taste for approaches, "
        "palettes and moods. The base model is a tiny random Llama that knows no language: everything it "
        "predicts was learned from the stored choices.",
        "- `tune` decides promotion on the studio's own held-out choices (every 4th): 2 choices (4 pairs) after "
        "10, 6 after 25, 12 after 50. On so few pairs a better adapter can lose by chance; it is then kept on "
        "file and the older one stays served, which is why `served` can lag `latest trained`. A first adapter "
        "needs at least 50% there; until one is promoted nothing is served (the preference axis is left out "
        "of grading), and `(k of n)` says over how many seeds a figure is taken.",
        "- Tune time covers loading, DPO training and judging the new and the promoted adapter on the held-out "
        "choices, on a shared CPU (see the load average).",
    ]
    out += ["\n## Every run\n",
            "| user temperature | seed | choices | version | promoted | tune's held-out accuracy | served "
            "| served pairwise | served top-1 |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        held = "n/a" if r.heldout_accuracy is None else f"{r.heldout_accuracy:.1%} of {r.heldout_pairs}"
        served = "none" if r.served_version is None else f"v{r.served_version}"
        out.append(f"| {r.temperature} | {r.seed} | {r.choices} | v{r.version} | {'yes' if r.promoted else 'no'} | "
                   f"{held} | {served} | {mean_sd([r.pairwise])} | {mean_sd([r.top1])} |")
    out.append(f"\nTotal benchmark time: {seconds / 60:.1f} min.")
    return "\n".join(out) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoints", type=int, nargs="+", default=[10, 25, 50],
                        help="numbers of choices after which `tune` runs (default: 10 25 50)")
    parser.add_argument("--seeds", type=int, default=4,
                        help="tastes simulated per user kind, one per seed (default: 4)")
    parser.add_argument("--test-choices", type=int, default=200, help="fresh A/B tests measured (default: 200)")
    parser.add_argument("--variations", type=int, default=3, help="variations per A/B test (default: 3)")
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
    texts += [prompt_of("", (a, c, m)) for a in AB_APPROACHES for c in COLOURS for m in MOODS]
    base = build_tiny_lm(data_dir / "tiny-llama", texts=texts)
    settings = Settings(data_dir=data_dir, database_url=args.database_url, preference_base_model_path=base,
                        min_preference_pairs=8)
    started = time.perf_counter()
    try:
        rows = [row for temperature in args.temperatures for seed in range(args.seeds)
                for row in run_seed(settings, base, seed=seed, temperature=temperature, args=args)]
        args.output.write_text(report(rows, args, command=command, seconds=time.perf_counter() - started))
        print(f"\nwrote {args.output}")
    finally:
        remove_data_dir(settings, data_dir)


if __name__ == "__main__":
    main()
