"""Which version of a user's taste serves them, decided on predictions made without the picks judged, and
what it expects.

Each tune fits a new version on every pick of the user (`mas.learning.taste.fit`); the evidence for it is its
cross-validated predictions, each pair predicted by a fit that never saw its pick, so every pick both teaches
and judges. A version records the last pick it was fitted on. The promotion rule compares log-likelihoods
per pair, paired on the same pairs, and is asymmetric on purpose, so that it does not flip-flop on a handful
of pairs:

- leaving the studio default (no preference, log-likelihood log 1/2 on every pair) needs evidence: the new
  version's predictions over every pick must beat it by more than one standard error of the difference
  (counted in picks, whose pairs move together);
- a newer version replaces the one serving unless, on the picks made since the serving one was fitted
  (which it never saw, and the new one predicts without them), it is worse by more than one standard error.

With no pick since the serving version, a tune has nothing to add and fits nothing. The DPO Tuner
(`gpu.tuner`) cannot afford to train five times, and judges its adapters on a fixed held-out share instead.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import sqlalchemy as sa

from mas.config import Settings
from mas.db import session_scope
from mas.domain.identity import Actor
from mas.learning.taste import MIN_PICKS_TO_CROSS_VALIDATE, Option, PairwiseTaste, Pick, fit
from mas.models import ABSelection, TasteModel

STANDARD_ERRORS = 1.0
"""How many standard errors of the paired difference the promotion rule asks for."""


def load_picks(settings: Settings, actor: Actor) -> list[Pick]:
    """`actor.user`'s A/B picks, oldest first, with the per-axis scores stored at pick time."""
    with session_scope(settings) as session:
        rows = session.scalars(
            sa.select(ABSelection).where(ABSelection.user_name == actor.user).order_by(ABSelection.id)
        ).all()
        picks = []
        for row in rows:
            scores = list(row.rejected_scores or [])
            rejected = tuple(
                Option(prompt=prompt, scores=scores[i] if i < len(scores) else {})
                for i, prompt in enumerate(row.rejected_prompts or [])
                if str(prompt).strip() and prompt != row.chosen_prompt
            )
            if row.chosen_prompt.strip() and rejected:
                picks.append(
                    Pick(
                        selection_id=row.id,
                        concept=row.concept,
                        chosen=Option(prompt=row.chosen_prompt, scores=row.chosen_scores or {}),
                        rejected=rejected,
                    )
                )
        return picks


def users_with_picks(settings: Settings) -> list[str]:
    """Every user who has picked an A/B winner, by name (the nightly tune runs for each)."""
    with session_scope(settings) as session:
        return list(session.scalars(sa.select(ABSelection.user_name).distinct().order_by(ABSelection.user_name)))


@dataclass(frozen=True, kw_only=True)
class Served:
    """The taste serving a user: a promoted version, or the studio default (version None)."""

    taste: PairwiseTaste
    version: int | None
    last_pick: int = 0
    """The id of the newest pick the version was fitted on (0 for the default: it saw none)."""

    @property
    def name(self) -> str:
        return f"taste v{self.version}" if self.version is not None else "the studio default (no preference)"

    def unseen(self, pick: Pick) -> bool:
        """Whether this version was fitted without `pick`."""
        return pick.selection_id > self.last_pick


def served(settings: Settings, actor: Actor) -> Served:
    """The newest promoted version of `actor.user`'s taste, or the default for a user with none."""
    with session_scope(settings) as session:
        row = session.scalars(
            sa.select(TasteModel)
            .where(TasteModel.user_name == actor.user, TasteModel.promoted.is_(True))
            .order_by(TasteModel.version.desc())
            .limit(1)
        ).first()
        taste = PairwiseTaste.from_json(row.model.get("served", {})) if row is not None else PairwiseTaste.default()
        if (
            row is None or taste.is_default
        ):  # none yet, or stored on other features: the default serves until a tune refits it
            return Served(taste=taste, version=None)
        return Served(taste=taste, version=row.version, last_pick=int(row.model["last_pick"]))


@dataclass(frozen=True, kw_only=True)
class Verdict:
    promote: bool
    pairs: int
    accuracy: float
    log_likelihood: float
    current_accuracy: float
    current_log_likelihood: float
    standard_error: float


def judge(candidate: np.ndarray, current: np.ndarray, *, picks: np.ndarray, against_default: bool) -> Verdict:
    """The promotion rule of the module docstring. `candidate` and `current` are the log-likelihoods of the
    same pairs, none of which either was fitted on; `picks[i]` is the pick pair i comes from. The pairs of
    one pick share its chosen side and rise or fall together, so the standard error counts picks, not pairs
    (clustered by pick)."""
    difference = candidate - current
    n, count = len(difference), len(np.unique(picks))
    mean = float(difference.mean())
    if count > 1:
        totals = np.bincount(np.unique(picks, return_inverse=True)[1], weights=difference - mean)
        error = float(math.sqrt(count / (count - 1) * np.sum(totals**2)) / n)
    else:
        error = math.inf
    if against_default:  # noqa: SIM108
        promote = mean - STANDARD_ERRORS * error > 0
    else:
        promote = not mean + STANDARD_ERRORS * error < 0
    return Verdict(
        promote=promote,
        pairs=n,
        accuracy=_accuracy(candidate),
        log_likelihood=float(candidate.mean()),
        current_accuracy=_accuracy(current),
        current_log_likelihood=float(current.mean()),
        standard_error=error,
    )


def _accuracy(log_likelihoods: np.ndarray) -> float:
    """Share of pairs whose chosen side is favoured (log P > log 0.5); a tie counts half."""
    half = math.log(0.5)
    return float(np.mean(np.where(np.isclose(log_likelihoods, half), 0.5, log_likelihoods > half)))


@dataclass(frozen=True, kw_only=True)
class TasteReport:
    """What a tune of the pairwise taste did, for `mas tune` to print."""

    user: str
    trained: bool
    promoted: bool
    reason: str
    picks: int
    pairs: int = 0
    judged_pairs: int = 0
    """Pairs the verdict rests on: every pair against the default, the pairs since the serving version else."""
    version: int | None = None
    accuracy: float | None = None
    """The new version's cross-validated accuracy on the judged pairs."""
    current_version: int | None = None
    current_accuracy: float | None = None
    seconds: float = 0.0


def tune_taste(settings: Settings, actor: Actor) -> TasteReport:
    """Fit a new version of `actor.user`'s taste on all their picks, judge it by the rule of the module
    docstring, store it (promoted or kept on file) with the reason. The caller holds the tune lock."""
    started = time.monotonic()
    picks = load_picks(settings, actor)
    pairs = sum(len(p.rejected) for p in picks)
    if pairs < settings.quality.min_preference_pairs or len(picks) < MIN_PICKS_TO_CROSS_VALIDATE:
        reason = (
            f"{actor.user} has {len(picks)} A/B picks ({pairs} pairs); {settings.quality.min_preference_pairs} pairs "
            f"are needed (MAS_MIN_PREFERENCE_PAIRS) and at least {MIN_PICKS_TO_CROSS_VALIDATE} picks, so each can "
            "be predicted without it. Until then the studio default serves (it expects every variation equally). "
            "Nothing was trained."
        )
        return TasteReport(user=actor.user, trained=False, promoted=False, reason=reason, picks=len(picks), pairs=pairs)
    current = served(settings, actor)
    fresh = [current.unseen(p) for p in picks]
    if not any(fresh):
        reason = f"no pick since {current.name}, which serves {actor.user}: nothing new to learn, nothing was trained."
        return TasteReport(
            user=actor.user,
            trained=False,
            promoted=False,
            reason=reason,
            picks=len(picks),
            pairs=pairs,
            current_version=current.version,
        )
    fitted = fit(picks, settings=settings)
    judged = np.asarray([fresh[i] for i, p in enumerate(picks) for _ in p.rejected])
    unseen_picks = [p for p, new in zip(picks, fresh) if new]
    verdict = judge(
        fitted.validation[judged],
        current.taste.pair_log_likelihoods(unseen_picks, settings=settings),
        picks=np.asarray([p.selection_id for p in unseen_picks for _ in p.rejected]),
        against_default=current.version is None,
    )
    with session_scope(settings) as session:
        version = 1 + int(
            session.scalar(
                sa.select(sa.func.coalesce(sa.func.max(TasteModel.version), 0)).where(
                    TasteModel.user_name == actor.user
                )
            )
            or 0
        )
        if current.version is None:
            on = f"predicted without each pick, over all {verdict.pairs} pairs of {len(picks)} picks"
            rule = "it must beat the default by more than one standard error"
        else:
            on = f"on the {verdict.pairs} pairs picked since {current.name} was fitted, each predicted without its pick"
            rule = "a newer version replaces it unless worse by more than one standard error"
        reason = (
            f"taste v{version} {'promoted' if verdict.promote else 'kept on file, not promoted'}: {on}, it is right "
            f"{verdict.accuracy:.0%} (log-likelihood {verdict.log_likelihood:.3f} per pair) against "
            f"{verdict.current_accuracy:.0%} ({verdict.current_log_likelihood:.3f}) for {current.name}; {rule} "
            f"({verdict.standard_error:.3f})."
        )
        session.add(
            TasteModel(
                user_name=actor.user,
                version=version,
                pairs_used=fitted.taste.pairs,
                heldout_pairs=verdict.pairs,
                heldout_accuracy=verdict.accuracy,
                promoted=verdict.promote,
                reason=reason,
                model={"served": fitted.taste.to_json(), "last_pick": picks[-1].selection_id},
            )
        )
    return TasteReport(
        user=actor.user,
        trained=True,
        promoted=verdict.promote,
        reason=reason,
        picks=len(picks),
        pairs=pairs,
        judged_pairs=verdict.pairs,
        version=version,
        accuracy=verdict.accuracy,
        current_version=current.version,
        current_accuracy=verdict.current_accuracy,
        seconds=round(time.monotonic() - started, 2),
    )


@dataclass(frozen=True, kw_only=True)
class Expectation:
    """Which variation the studio expects the user to pick, and with what probability."""

    label: str | None
    probability: float | None
    by: str


def expectation_text(*, expected: str | None, probability: float | None, by: str | None, winner: str | None) -> str:
    """One line for people: what the studio expected of an A/B test and whether the pick proved it right."""
    if winner is None:
        return "not picked yet; the studio says what it expected once you pick"
    if expected is None:
        return f"the studio expected nothing ({by or 'no taste yet'})"
    verdict = "right" if expected == winner else f"wrong: you picked {winner}"
    return f"the studio expected {expected} ({probability:.0%}, {by}): {verdict}"


def expect(settings: Settings, actor: Actor, options: Mapping[str, Option]) -> Expectation:
    """The variation `actor.user`'s served taste expects them to pick among `options` (by label)."""
    current = served(settings, actor)
    if current.version is None:
        return Expectation(label=None, probability=None, by=f"no expectation: {current.name} serves {actor.user}")
    labels = sorted(options)
    probabilities = current.taste.choice_probabilities([options[label] for label in labels], settings=settings)
    best = int(np.argmax(probabilities))
    return Expectation(label=labels[best], probability=probabilities[best], by=current.name)


def ranker(settings: Settings, actor: Actor):
    """A Writer ranker (`mas.agents.asking.Ranker`): candidate prompts scored by `actor.user`'s served
    taste (log-odds; with the default every candidate scores 0 and the model's first candidate wins)."""

    def rank(concept: str, prompts: Sequence[str]) -> list[float]:  # noqa: ARG001
        current = served(settings, actor)
        if current.version is None:
            return [0.0] * len(prompts)
        return current.taste.logits([Option(prompt=p) for p in prompts], settings=settings).tolist()

    return rank
