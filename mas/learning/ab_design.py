"""Which variations an A/B test offers: those whose pick would teach the user's taste the most.

The Director proposes more variations than the test shows. A pick among variations that differ only where
the studio already knows the user's taste teaches little, and so does one whose winner the studio can
already call; one among variations that differ where it does not, and that it expects about equally, teaches
much. So the studio offers the set that maximises the expected information of the pick about the taste's
weights (locally D-optimal sequential design for the multinomial logit of `mas.learning.taste`, taken at the taste
serving the user):

- the information of one choice among k options with taste features X, where the served taste expects
  option i with probability p_i, is `F = X^T (diag(p) - p p^T) X`; it does not depend on which option wins,
  so the design needs no labels;
- what is known is the information of the user's past picks, `A = prior + sum over picks of F(pick)`;
- a candidate set S is worth `log det(A + F(S)) - log det(A) = log det(I + M_S X_S A^-1 X_S^T)`, a k x k
  determinant, with `M_S = diag(p_S) - p_S p_S^T`;
- the set is grown greedily, one variation at a time, which is the standard approximation for log det.

The information is about the weights of the taste's sum of phrases; the interaction between phrases, when
the taste has one, enters through p. That is the design's blind spot: it is optimal for what the taste can
already say, so a user whose taste lies mostly in how phrases combine (warm colours only with calm moods) is
seldom shown the sets that would reveal it, and the interaction is never learned. So `settings.ab.explore` of
the variations shown (one by default) are drawn at random among the other proposals, the design choosing the
rest (at least two).

With no taste promoted yet, every option is expected equally (p = 1/k) and, with no pick either, the set is
simply the most varied one. What the design gains over offering the Director's first variations is measured
by the learning benchmark (`bench/RESULTS-learning.md`).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from itertools import combinations

import numpy as np

from mas.agents.roles import Plan
from mas.config import Settings
from mas.domain.identity import Actor
from mas.domain.requests import MAX_VARIATIONS, ProductionRequest
from mas.learning.promotion import load_picks, served
from mas.learning.taste import Option, PairwiseTaste, Pick, features, softmax

log = logging.getLogger(__name__)

PRIOR_PRECISION = 0.5
"""The information the studio has before any pick, per feature: the L2 penalty of a taste fitted at
regularisation 1 (the middle of `mas.learning.taste.REGULARISATION_GRID`) read as a Gaussian prior's precision."""


def choice_information(rows: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """F = X^T (diag(p) - p p^T) X: the Fisher information about the weights of one pick among these
    options, p being the served taste's expectation of each (uniform for the default taste)."""
    p = softmax(logits)
    return rows.T @ ((np.diag(p) - np.outer(p, p)) @ rows)


def known_information(picks: Sequence[Pick], taste: PairwiseTaste, *, settings: Settings) -> np.ndarray:
    """A: the prior plus the information of every past pick (whatever was picked)."""
    groups = [[p.chosen, *p.rejected] for p in picks]
    flat = [o for group in groups for o in group]
    rows, logits = features(flat, settings=settings), taste.logits(flat, settings=settings)
    known = PRIOR_PRECISION * np.eye(rows.shape[1])
    at = 0
    for group in groups:
        known += choice_information(rows[at : at + len(group)], logits[at : at + len(group)])
        at += len(group)
    return known


def set_value(uncertainty: np.ndarray, logits: np.ndarray, chosen: Sequence[int]) -> float:
    """log det(I + M_S K_S): what a pick among `chosen` would add, K = X A^-1 X^T and `logits` over the pool."""
    p = softmax(logits[list(chosen)])
    spread = np.diag(p) - np.outer(p, p)
    return float(np.linalg.slogdet(np.eye(len(chosen)) + spread @ uncertainty[np.ix_(chosen, chosen)])[1])


def most_informative(
    options: Sequence[Option], *, count: int, picks: Sequence[Pick], taste: PairwiseTaste, settings: Settings
) -> list[int]:
    """Indices (ascending) of the `count` (at least 2: an A/B test) options whose pick would teach the
    owner of `picks` and `taste` (the taste serving them) the most."""
    if count >= len(options):
        return list(range(len(options)))
    rows = features(options, settings=settings)
    uncertainty = rows @ np.linalg.solve(known_information(picks, taste, settings=settings), rows.T)
    value = partial(set_value, uncertainty, taste.logits(options, settings=settings))
    # one option alone teaches nothing: start from the most informative pair, then add one at a time
    chosen = list(max(combinations(range(len(options)), 2), key=value))
    while len(chosen) < count:
        chosen.append(max((i for i in range(len(options)) if i not in chosen), key=lambda i: value([*chosen, i])))
    return sorted(chosen)


def explored(options: int, *, designed: Sequence[int], count: int, seed: str) -> list[int]:
    """Indices (ascending) of `designed` and `count` more options drawn at random among the rest, from a
    generator seeded by `seed`, so the same user with the same picks is offered the same set."""
    rest = [i for i in range(options) if i not in designed]
    return sorted([*designed, *random.Random(seed).sample(rest, min(count, len(rest)))])


def proposals_request(request: ProductionRequest, *, settings: Settings) -> ProductionRequest:
    """What the Director is asked for an A/B test: `settings.ab.proposals` variations per one shown."""
    return replace(request, count=min(request.count * settings.ab.proposals, MAX_VARIATIONS))


def offer(plan: Plan, *, count: int, settings: Settings, actor: Actor) -> Plan:
    """The `count` proposed variations `actor.user` is shown, in the Director's order, labelled A, B, ...:
    `settings.ab.explore` of them at random, the others chosen by the design.

    Proposals repeating the concept and approach of an earlier one are dropped first; with fewer than `count`
    distinct ones left, the Director's first `count` are shown as they are."""
    seen: set[str] = set()
    distinct = []
    for video in plan.videos:
        key = " ".join(f"{video.concept} {video.approach}".lower().split())
        if key not in seen:
            seen.add(key)
            distinct.append(video)
    if len(distinct) < count:
        shown = list(plan.videos[:count])
    else:
        options, picks = [Option(prompt=f"{v.concept}, {v.approach}") for v in distinct], load_picks(settings, actor)
        by_design = min(count, max(2, count - settings.ab.explore))  # a pick teaches only against another
        designed = most_informative(
            options, count=by_design, picks=picks, taste=served(settings, actor).taste, settings=settings
        )
        chosen = explored(
            len(options), designed=designed, count=count - len(designed), seed=f"{actor.user} {len(picks)}"
        )
        shown = [distinct[i] for i in chosen]
        log.info("A/B test for %s: %d proposals, showing %s", actor.user, len(plan.videos), [v.approach for v in shown])
    return replace(plan, videos=[replace(v, label=chr(ord("A") + i)) for i, v in enumerate(shown)])
