"""The user's taste, learned from their A/B picks: which of several prompts they would likely choose.

A pairwise (Bradley-Terry) model over the shipped all-MiniLM-L6-v2 embeddings: each pick says the chosen
prompt beats each rejected one, P(a beats b) = sigmoid(w . (e(a) - e(b))), and w is fitted by L2-
regularised logistic regression on those differences. It trains in milliseconds on CPU, so the Writer's
ranker refits it from the current picks on each call and never serves a stale taste.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import sqlalchemy as sa

from mas.config import Settings
from mas.db import session_scope
from mas.memory.embeddings import get_embedder
from mas.models import ABSelection

log = logging.getLogger(__name__)

L2 = 1.0
"""Regularisation strength: with few picks the model stays near "no preference"."""

STEPS = 300
"""Gradient steps of the fit (the problem is convex and small; this converges)."""


@dataclass(frozen=True, kw_only=True)
class Taste:
    """A fitted taste: a weight per embedding dimension, and how many pairs it learned from."""

    weights: np.ndarray
    pairs: int

    def scores(self, prompts: Sequence[str], *, settings: Settings) -> list[float]:
        """How much the user is expected to like each prompt (higher is better; only differences matter)."""
        vectors = np.asarray(get_embedder(settings).embed(list(prompts)), dtype=np.float64)
        return (vectors @ self.weights).tolist()

    def probability(self, a: str, b: str, *, settings: Settings) -> float:
        """P(the user picks `a` over `b`)."""
        score_a, score_b = self.scores([a, b], settings=settings)
        return float(1 / (1 + np.exp(-(score_a - score_b))))


def picked_pairs(settings: Settings) -> list[tuple[str, str]]:
    """(chosen, rejected) prompts of every A/B pick, oldest first."""
    with session_scope(settings) as session:
        rows = session.execute(
            sa.select(ABSelection.chosen_prompt, ABSelection.rejected_prompts).order_by(ABSelection.id)
        ).all()
    return [(chosen, rejected) for chosen, rejections in rows for rejected in rejections or [] if chosen and rejected]


def fit(settings: Settings, pairs: Sequence[tuple[str, str]]) -> Taste:
    """The Bradley-Terry weights that best explain `pairs` (chosen, rejected)."""
    texts = sorted({t for pair in pairs for t in pair})
    vectors = dict(zip(texts, np.asarray(get_embedder(settings).embed(texts), dtype=np.float64)))
    diffs = np.stack([vectors[a] - vectors[b] for a, b in pairs])
    weights = np.zeros(diffs.shape[1])
    rate = 1.0
    for _ in range(STEPS):
        p = 1 / (1 + np.exp(-(diffs @ weights)))
        gradient = -diffs.T @ (1 - p) / len(diffs) + L2 * weights / len(diffs)
        weights -= rate * gradient
    return Taste(weights=weights, pairs=len(pairs))


def current(settings: Settings) -> Taste | None:
    """The taste learned from the picks so far; None until there are `MIN_PREFERENCE_PAIRS` of them."""
    pairs = picked_pairs(settings)
    if len(pairs) < settings.min_preference_pairs:
        return None
    return fit(settings, pairs)


def ranker(settings: Settings):
    """A Writer ranker (`mas.agents.asking.Ranker`) that scores candidates by the current taste.

    With too few picks every candidate scores 0 and the model's first candidate wins.
    """

    def rank(concept: str, prompts: Sequence[str]) -> list[float]:
        taste = current(settings)
        if taste is None:
            return [0.0] * len(prompts)
        return taste.scores(prompts, settings=settings)

    return rank
