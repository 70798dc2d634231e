"""A user's taste: the probability that they pick each of several variations, learned from their A/B picks.

A pairwise (Bradley-Terry) model. Each option is described by features the studio already has: the shipped
all-MiniLM-L6-v2 embeddings of its prompt's phrases, and the per-axis scores of its video when it has been
graded (the `preference` axis, the promoted DPO adapter's implicit reward, enters as its log-odds: see the
README on how the two are combined). A video prompt is a list of comma-separated phrases ("a dragon, aerial
drone sweep, teal palette, ..."); each phrase is embedded alone and the embeddings are summed, so a phrase
weighs the same whatever surrounds it and a phrase shared by every variation (the concept) cancels out. Each
phrase also has a weight of its own, for what its meaning does not tell.
A taste can also hold an interaction between a prompt's phrases, for a user who likes warm colours with
calm moods but not with energetic ones, which a sum of phrase weights cannot say: a rank-1 factorisation
machine (Rendle 2010) gives every phrase a latent value z = theta[its own bucket], and adds the sum of z_p z_q
over each pair of phrases of a prompt, leaving out its first phrase, the subject (the Writer names it first,
and what the user thinks of it does not depend on the styling). The latent is the phrase's own, not read from
its embedding: MiniLM does not carry what such a taste is about (a colour's warmth, a mood's energy), and a
phrase never picked has no interaction to tell. It is kept only when it predicts the picks better than the sum
alone (cross-validated, as below).
The user picks option i among k with probability softmax(u_i), u_i = w . x_i + interaction_i, so one pick of
one among k gives k - 1 pairs, P(a beats b) = sigmoid(u_a - u_b). `w` is fitted by L2-regularised
logistic regression (scikit-learn) on those differences, the regularisation chosen by cross-validation over
picks; with an interaction, w and theta are then fitted together (L-BFGS, scipy, the same L2 on w, the best of
a few starts), theta's L2 strength chosen by the same cross-validation, or none; and the log-odds are scaled
by one temperature fitted on the cross-validated predictions (Platt scaling without intercept), so a
probability of 0.8 is right about four times in five. Those cross-validated predictions are also the evidence
a new version is judged by. It fits in seconds on a CPU.
Which version serves a user, and why, is `mas.learning.promotion`.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from mas.config import Settings
from mas.gpu_rules.grading import BENCHMARK_METRICS, MULTI_AXES
from mas.memory.embeddings import get_embedder
from mas.models import EMBEDDING_DIM

SCORE_FEATURES = ("semantic", "spatial", "benchmark", "multi_axis", *BENCHMARK_METRICS, *MULTI_AXES)
"""Per-axis scores in [0, 1] used as features (centred on 0.5; a missing one counts as 0.5)."""

PREFERENCE_FEATURE = "preference"
"""The DPO axis: sigmoid of the adapter's reward, used as its log-odds (the reward itself)."""

SCORE_SCALE = 10.0
"""Centred scores are multiplied by this: there are few of them and each sums up a whole axis of the video,
so the L2 penalty, sized for 384 embedding dimensions, must not shrink them away."""

PHRASE_BUCKETS = 1024
"""Besides its meaning (the embedding), each phrase has a value of its own to the user, which MiniLM cannot
know: a weight per phrase, hashed (crc32, the same in every process) into this many buckets."""

PHRASE_OWN_SCALE = 1.0
"""The size of that per-phrase feature against the unit-length embedding: 1 lets a phrase's own value and
its meaning count alike under the one L2 penalty."""

FEATURES = (
    *[f"phrases[{i}]" for i in range(EMBEDDING_DIM)],
    *[f"phrase_own[{i}]" for i in range(PHRASE_BUCKETS)],
    *SCORE_FEATURES,
    PREFERENCE_FEATURE,
)

INTERACTION_GRID = (0.3, 1.0, 3.0)
"""L2 strengths on the interaction's theta tried by cross-validation, beside no interaction (the penalty is
(strength / 2) |theta|^2 against the summed pair log-loss)."""

INTERACTION_START = 0.1
"""Standard deviation of theta's starting points, drawn from fixed seeds so a tune is repeatable: the
factorisation machine's loss has a saddle at theta = 0, where it would stay."""

INTERACTION_STARTS = 3
"""Starting points of each fit with an interaction, the one with the lowest loss kept: the loss is not convex
in theta, and one start sometimes stopped far from the best."""

REGULARISATION_GRID = (0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0)
"""Inverse L2 strengths tried by cross-validation: with few picks a strong one wins and the model stays
near "no preference"; with many, a weaker one lets it follow the user."""

PLATT_REGULARISATION = 1e6
"""Inverse L2 strength of the one-parameter calibration fit: large, so the penalty does not bias it."""

MIN_PICKS_TO_CROSS_VALIDATE = 4
"""Below this many picks there is nothing to validate on: the middle strength and no temperature."""


@dataclass(frozen=True, kw_only=True)
class Option:
    """One variation the user could pick: its prompt and, once graded, its video's per-axis scores."""

    prompt: str
    scores: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Pick:
    """One A/B pick: the user chose `chosen` over each of `rejected`."""

    selection_id: int
    concept: str
    chosen: Option
    rejected: tuple[Option, ...]


@dataclass(frozen=True, kw_only=True)
class PairwiseTaste:
    """Fitted weights (temperature applied) and how they were fitted; all zeros is the studio default,
    which expects every variation equally."""

    weights: np.ndarray
    latents: np.ndarray | None = None
    """theta of the interaction between phrases (one value per phrase bucket); None: no interaction."""
    pairs: int = 0
    regularisation: float | None = None
    interaction_strength: float | None = None
    """The L2 strength the interaction was fitted with (`INTERACTION_GRID`); None: no interaction."""
    temperature: float = 1.0

    @classmethod
    def default(cls) -> PairwiseTaste:
        return cls(weights=np.zeros(len(FEATURES)))

    @property
    def is_default(self) -> bool:
        return not np.any(self.weights) and self.latents is None

    def logits(self, options: Sequence[Option], *, settings: Settings) -> np.ndarray:
        """w . x + interaction per option: only differences matter; a difference is log-odds."""
        table = phrase_table(options, settings=settings)
        out = features(options, settings=settings, table=table) @ self.weights
        return out if self.latents is None else out + interaction(table, self.latents)

    def choice_probabilities(self, options: Sequence[Option], *, settings: Settings) -> list[float]:
        """P(the user picks each option) among `options` (they sum to 1)."""
        return softmax(self.logits(options, settings=settings)).tolist()

    def pair_log_likelihoods(self, picks: Sequence[Pick], *, settings: Settings) -> np.ndarray:
        """log P(chosen beats rejected) for every pair of `picks`, in order."""
        if not picks:
            return np.zeros(0)
        options, pairs = pair_incidence(picks)
        return -np.logaddexp(0.0, -(pairs @ self.logits(options, settings=settings)))

    def to_json(self) -> dict:
        return {
            "features": list(FEATURES),
            "weights": self.weights.tolist(),
            "pairs": self.pairs,
            "latents": None if self.latents is None else self.latents.tolist(),
            "regularisation": self.regularisation,
            "interaction_strength": self.interaction_strength,
            "temperature": self.temperature,
        }

    @classmethod
    def from_json(cls, data: Mapping) -> PairwiseTaste:
        if list(data.get("features") or ()) != list(FEATURES):
            return cls.default()  # fitted on other features: a refit is needed, the default serves meanwhile
        latents = data.get("latents")  # absent in a taste stored before the interaction: it has none
        if latents is not None and len(latents) != PHRASE_BUCKETS:
            return cls.default()  # an interaction over other phrase features: a refit is needed
        return cls(
            weights=np.asarray(data["weights"], dtype=np.float64),
            pairs=int(data["pairs"]),
            latents=None if latents is None else np.asarray(latents, dtype=np.float64),
            regularisation=data["regularisation"],
            interaction_strength=data.get("interaction_strength"),
            temperature=float(data["temperature"]),
        )


def softmax(logits: np.ndarray) -> np.ndarray:
    """The choice probabilities of options with these logits (they sum to 1)."""
    odds = np.exp(logits - logits.max())
    return odds / odds.sum()


def score_features(scores: Mapping[str, float]) -> list[float]:
    """The per-axis part of an option's features: centred scores, and the DPO reward as log-odds."""
    values = [SCORE_SCALE * (float(scores[name]) - 0.5) if name in scores else 0.0 for name in SCORE_FEATURES]
    preference = scores.get(PREFERENCE_FEATURE)
    if preference is None:
        values.append(0.0)
    else:
        p = min(max(float(preference), 1e-4), 1 - 1e-4)
        values.append(math.log(p / (1 - p)))
    return values


def phrases(prompt: str) -> list[str]:
    """The comma-separated phrases of a prompt (the whole prompt when it has no comma)."""
    parts = [part.strip() for part in prompt.split(",")]
    return [part for part in parts if part] or [prompt.strip() or prompt]


@dataclass(frozen=True, kw_only=True)
class PhraseTable:
    """The distinct phrases of some options, described once, and which option has which."""

    rows: np.ndarray
    """One row per distinct phrase: its embedding, then its own bucket (`PHRASE_OWN_SCALE`)."""
    counts: np.ndarray
    """options x phrases: how often each option's prompt has each phrase."""
    styling: np.ndarray
    """The same without each prompt's first phrase (its subject): the phrases the interaction is between."""

    @property
    def own(self) -> np.ndarray:
        """Each phrase's own bucket alone (the last `PHRASE_BUCKETS` columns of `rows`): what the interaction
        reads."""
        return self.rows[:, EMBEDDING_DIM:]


def phrase_table(options: Sequence[Option], *, settings: Settings) -> PhraseTable:
    split = [phrases(o.prompt) for o in options]
    distinct = sorted({phrase for parts in split for phrase in parts})
    column = {phrase: i for i, phrase in enumerate(distinct)}
    own = np.zeros((len(distinct), PHRASE_BUCKETS))
    for i, phrase in enumerate(distinct):
        own[i, zlib.crc32(phrase.encode()) % PHRASE_BUCKETS] = PHRASE_OWN_SCALE
    embedded = np.asarray(get_embedder(settings).embed(distinct), dtype=np.float64).reshape(
        len(distinct), EMBEDDING_DIM
    )
    counts, styling = np.zeros((len(options), len(distinct))), np.zeros((len(options), len(distinct)))
    for row, parts in enumerate(split):
        for at, phrase in enumerate(parts):
            counts[row, column[phrase]] += 1
            if at > 0:
                styling[row, column[phrase]] += 1
    return PhraseTable(rows=np.hstack([embedded, own]), counts=counts, styling=styling)


def features(options: Sequence[Option], *, settings: Settings, table: PhraseTable | None = None) -> np.ndarray:
    """One row per option: the sum of its phrases' embeddings, its phrases' own buckets, its score features.
    `table`: the options' phrase table when the caller already has it."""
    if not options:
        return np.zeros((0, len(FEATURES)))
    table = table or phrase_table(options, settings=settings)
    return np.hstack(
        [table.counts @ table.rows, np.asarray([score_features(o.scores) for o in options], dtype=np.float64)]
    )


def interaction(table: PhraseTable, latents: np.ndarray) -> np.ndarray:
    """Per option, the sum over pairs of its styling phrases of z_p z_q, z = own bucket . latents:
    ((sum z)^2 - sum z^2) / 2, which costs one pass over the phrases."""
    z = table.own @ latents
    return 0.5 * ((table.styling @ z) ** 2 - table.styling @ z**2)


def pair_incidence(picks: Sequence[Pick]) -> tuple[list[Option], np.ndarray]:
    """Every option of `picks` in order, and pairs x options: +1 for the chosen, -1 for the rejected of each
    pair, so that `pairs @ u` is u(chosen) - u(rejected)."""
    options = [o for p in picks for o in (p.chosen, *p.rejected)]
    pairs, at = [], 0
    for p in picks:
        for i in range(len(p.rejected)):
            row = np.zeros(len(options))
            row[at], row[at + 1 + i] = 1.0, -1.0
            pairs.append(row)
        at += 1 + len(p.rejected)
    return options, np.asarray(pairs).reshape(-1, len(options))


@dataclass(frozen=True, kw_only=True)
class Fit:
    """A fitted taste and the evidence for it."""

    taste: PairwiseTaste
    validation: np.ndarray
    """log P(chosen beats rejected) of every pair of the picks, in order, each predicted by a fit that never
    saw its pick (5-fold over picks, the chosen strength, calibrated); empty when there were too few picks
    to cross-validate. What `mas.learning.promotion` judges a new version by."""


def fit(picks: Sequence[Pick], *, settings: Settings) -> Fit:
    """The taste that best explains `picks`: regularisation and interaction by cross-validation, calibrated."""
    from sklearn.model_selection import GroupKFold  # only a tune fits; reading a taste must not load sklearn (1 s)

    if not picks:
        return Fit(taste=PairwiseTaste.default(), validation=np.zeros(0))
    options, pairs = pair_incidence(picks)
    table = phrase_table(options, settings=settings)
    diffs = pairs @ features(options, settings=settings, table=table)
    groups = np.asarray([p.selection_id for p in picks for _ in p.rejected])
    if len({*groups}) < MIN_PICKS_TO_CROSS_VALIDATE:
        regularisation = REGULARISATION_GRID[len(REGULARISATION_GRID) // 2]
        taste = PairwiseTaste(weights=_weights(diffs, regularisation), pairs=len(diffs), regularisation=regularisation)
        return Fit(taste=taste, validation=np.zeros(0))
    folds = list(GroupKFold(n_splits=min(5, len({*groups}))).split(diffs, groups=groups))
    best = None
    for regularisation in REGULARISATION_GRID:
        held, fold_weights = np.zeros(len(diffs)), []
        for train, test in folds:
            fold_weights.append(_weights(diffs[train], regularisation))
            held[test] = diffs[test] @ fold_weights[-1]
        loss = _log_loss(held)
        if best is None or loss < best[0]:
            best = (loss, regularisation, held, fold_weights)
    assert best is not None  # the grid is not empty
    _, regularisation, held, fold_weights = best
    strength, held = _interaction_strength(table, pairs, diffs, folds, fold_weights, held, regularisation)
    weights, latents = _weights(diffs, regularisation), None
    if strength is not None:
        weights, latents = _with_interaction(table, pairs, diffs, weights, regularisation, strength)
    temperature = _temperature(held)
    taste = PairwiseTaste(
        weights=weights * temperature,
        pairs=len(diffs),
        regularisation=regularisation,
        latents=None if latents is None else latents * math.sqrt(temperature),
        interaction_strength=strength,
        temperature=temperature,
    )
    return Fit(taste=taste, validation=-np.logaddexp(0.0, -held * temperature))


def _interaction_strength(
    table: PhraseTable,
    pairs: np.ndarray,
    diffs: np.ndarray,
    folds: list,
    fold_weights: list[np.ndarray],
    held: np.ndarray,
    regularisation: float,
) -> tuple[float | None, np.ndarray]:
    """The interaction strength that predicts the held-out picks best, and its held-out log-odds; or None and
    the sum's own (`held`) when no strength beats the sum. (Asking it to beat the sum by a standard error
    dropped more real interactions than chance ones on the learning benchmark's users.)"""
    best = None
    for strength in INTERACTION_GRID:
        margins = np.zeros(len(diffs))
        for (train, test), start in zip(folds, fold_weights):
            weights, latents = _with_interaction(table, pairs[train], diffs[train], start, regularisation, strength)
            margins[test] = diffs[test] @ weights + pairs[test] @ interaction(table, latents)
        if best is None or _log_loss(margins) < _log_loss(best[1]):
            best = (strength, margins)
    assert best is not None  # the grid is not empty
    return best if _log_loss(best[1]) < _log_loss(held) else (None, held)


def _log_loss(margins: np.ndarray) -> float:
    """Mean -log P(chosen beats rejected) of pairs whose log-odds for the chosen are `margins`."""
    return float(np.logaddexp(0.0, -margins).mean())


def _with_interaction(
    table: PhraseTable, pairs: np.ndarray, diffs: np.ndarray, start: np.ndarray, regularisation: float, strength: float
) -> tuple[np.ndarray, np.ndarray]:
    """w and theta fitted together on `pairs` (rows of `pair_incidence`, `diffs` their feature differences),
    from w = `start` (the sum's own fit): summed pair log-loss + |w|^2 / (4 regularisation), the L2 of
    `_weights` (which counts each pair twice, once each way), + (strength / 2) |theta|^2. Fitting them
    together lets the sum give up what the interaction explains better. The best of `INTERACTION_STARTS`."""
    from scipy.optimize import minimize
    from scipy.special import expit

    size = diffs.shape[1]

    def loss_and_gradient(both: np.ndarray) -> tuple[float, np.ndarray]:
        weights, latents = both[:size], both[size:]
        z = table.own @ latents
        summed = table.styling @ z
        margins = diffs @ weights + pairs @ (0.5 * (summed**2 - table.styling @ z**2))
        slope = -expit(-margins)
        per_option = pairs.T @ slope
        per_phrase = table.styling.T @ (per_option * summed) - (table.styling.T @ per_option) * z
        loss = float(
            np.logaddexp(0.0, -margins).sum()
            + weights @ weights / (4 * regularisation)
            + 0.5 * strength * latents @ latents
        )
        gradient_w = diffs.T @ slope + weights / (2 * regularisation)
        return loss, np.r_[gradient_w, table.own.T @ per_phrase + strength * latents]

    starts = [
        np.r_[start, np.random.default_rng(seed).normal(0.0, INTERACTION_START, PHRASE_BUCKETS)]
        for seed in range(INTERACTION_STARTS)
    ]
    fits = [minimize(loss_and_gradient, both, jac=True, method="L-BFGS-B") for both in starts]
    best = min(fits, key=lambda result: result.fun).x
    return best[:size], best[size:]


def _weights(diffs: np.ndarray, regularisation: float, *, sure: float = 1.0) -> np.ndarray:
    """Logistic regression on the differences, with no intercept: a pair read both ways is the same pick, so
    each difference is shown as a win (x_a - x_b) and as a loss (x_b - x_a). `sure` below 1 makes the
    targets soft: each is that likely to be the user's side, the rest of its weight on the other."""
    from sklearn.linear_model import LogisticRegression

    x = np.vstack([diffs, -diffs])
    y = np.r_[np.ones(len(diffs)), np.zeros(len(diffs))]
    weight = np.ones(len(x))
    if sure < 1.0:
        x, y, weight = np.vstack([x, x]), np.r_[y, 1 - y], np.r_[np.full(len(x), sure), np.full(len(x), 1 - sure)]
    model = LogisticRegression(C=regularisation, fit_intercept=False, max_iter=1000)
    return model.fit(x, y, sample_weight=weight).coef_[0]


def _temperature(held_out_logits: np.ndarray) -> float:
    """The scale t minimising the log-loss of sigmoid(t * logit) on predictions made without the pick:
    Platt scaling with no intercept (a pair has no side), which is the same logistic regression on the one
    feature `logit`, all but unregularised, kept within [0.01, 100]. As Platt (1999) does, the targets are
    (n + 1) / (n + 2) rather than 1: when every held-out prediction was right (a consistent user, few picks),
    plain log-loss would push t to its bound and the taste would call a guess certain."""
    if not np.any(held_out_logits):
        return 1.0
    n = len(held_out_logits)
    t = _weights(held_out_logits[:, None], PLATT_REGULARISATION, sure=(n + 1) / (n + 2))[0]
    return float(np.clip(t, 0.01, 100.0))
