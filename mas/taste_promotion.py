"""Which version of a user's taste serves them, decided on picks it never trained on, and what it expects.

Every `HELDOUT_EVERY`-th pick of a user (in the order they were made) is held out of the judging once and
for all, so the held-out set grows as picks accumulate and two versions are always judged on the same picks
(the DPO Tuner, `gpu.tuner`, holds out the same picks). A new version is fitted twice: on the training picks
alone, which is what the rule judges, and on every pick, which is what serves once it is promoted (the same
fitting procedure given a quarter more evidence; the learning benchmark measured what keeping those picks
out of the served taste costs). The judged fit of the new version is compared with the judged fit of the one
serving now by the log-likelihood of each held-out pair (paired, so it is the same pairs). The promotion rule
is asymmetric on purpose, so that it does not flip-flop on a handful of pairs:

- leaving the studio default (no preference) needs evidence: the new version must beat it by more than one
  standard error of the paired difference;
- a newer version, trained on more picks, replaces an older one unless the held-out picks say it is worse by
  more than one standard error.
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
from mas.models import ABSelection, TasteModel
from mas.taste import Option, PairwiseTaste, Pick, fit

HELDOUT_EVERY = 4
"""Every 4th pick of a user is held out to judge versions (shared with the DPO Tuner)."""

STANDARD_ERRORS = 1.0
"""How many standard errors of the paired held-out difference the promotion rule asks for."""


def held_out(position: int, *, every: int = HELDOUT_EVERY) -> bool:
    """Whether the pick at `position` (0-based, in the user's pick order) is held out."""
    return position % every == every - 1


def load_picks(settings: Settings) -> list[Pick]:
    """`settings.user`'s A/B picks, oldest first, with the per-axis scores stored at pick time."""
    with session_scope(settings) as session:
        rows = session.scalars(
            sa.select(ABSelection).where(ABSelection.user_name == settings.user).order_by(ABSelection.id)
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
                picks.append(Pick(selection_id=row.id, concept=row.concept,
                                  chosen=Option(prompt=row.chosen_prompt, scores=row.chosen_scores or {}),
                                  rejected=rejected))
        return picks


def users_with_picks(settings: Settings) -> list[str]:
    """Every user who has picked an A/B winner, by name (the nightly tune runs for each)."""
    with session_scope(settings) as session:
        return list(session.scalars(sa.select(ABSelection.user_name).distinct().order_by(ABSelection.user_name)))


def split(picks: Sequence[Pick], *, every: int = HELDOUT_EVERY) -> tuple[list[Pick], list[Pick]]:
    """(train, held out) by position in pick order."""
    return ([p for i, p in enumerate(picks) if not held_out(i, every=every)],
            [p for i, p in enumerate(picks) if held_out(i, every=every)])


@dataclass(frozen=True, kw_only=True)
class Served:
    """The taste serving a user: a promoted version, or the studio default (version None)."""

    taste: PairwiseTaste
    version: int | None
    judged: PairwiseTaste
    """The version fitted without the held-out picks: what the promotion rule compares."""

    @property
    def name(self) -> str:
        return f"taste v{self.version}" if self.version is not None else "the studio default (no preference)"


def served(settings: Settings) -> Served:
    """The newest promoted version of `settings.user`'s taste, or the default for a user with none."""
    with session_scope(settings) as session:
        row = session.scalars(
            sa.select(TasteModel)
            .where(TasteModel.user_name == settings.user, TasteModel.promoted.is_(True))
            .order_by(TasteModel.version.desc()).limit(1)
        ).first()
        taste = PairwiseTaste.from_json(row.model.get("served", {})) if row is not None else PairwiseTaste.default()
        if taste.is_default:  # none yet, or stored on other features: the default serves until a tune refits it
            return Served(taste=taste, version=None, judged=taste)
        return Served(taste=taste, version=row.version, judged=PairwiseTaste.from_json(row.model.get("judged", {})))


@dataclass(frozen=True, kw_only=True)
class Verdict:
    promote: bool
    accuracy: float
    log_likelihood: float
    current_accuracy: float
    current_log_likelihood: float
    standard_error: float


def judge(candidate: PairwiseTaste, current: Served, heldout: Sequence[Pick], *, settings: Settings) -> Verdict:
    """The promotion rule of the module docstring, on the held-out pairs; `candidate` is fitted without them."""
    new = candidate.pair_log_likelihoods(heldout, settings=settings)
    old = current.judged.pair_log_likelihoods(heldout, settings=settings)
    difference = new - old
    n = len(difference)
    error = float(np.std(difference, ddof=1) / math.sqrt(n)) if n > 1 else math.inf
    mean = float(difference.mean())
    if current.version is None:
        promote = mean - STANDARD_ERRORS * error > 0
    else:
        promote = not mean + STANDARD_ERRORS * error < 0
    return Verdict(promote=promote, accuracy=_accuracy(new), log_likelihood=float(new.mean()),
                   current_accuracy=_accuracy(old), current_log_likelihood=float(old.mean()), standard_error=error)


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
    train_pairs: int = 0
    heldout_pairs: int = 0
    version: int | None = None
    heldout_accuracy: float | None = None
    current_version: int | None = None
    current_accuracy: float | None = None
    seconds: float = 0.0


def tune_taste(settings: Settings, *, every: int = HELDOUT_EVERY) -> TasteReport:
    """Fit a new version of `settings.user`'s taste on their training picks, judge it on the held-out ones,
    store it (promoted or kept on file, with its fit on every pick) and the reason. The caller holds the tune
    lock."""
    started = time.monotonic()
    picks = load_picks(settings)
    train, heldout = split(picks, every=every)
    pairs = sum(len(p.rejected) for p in picks)
    if pairs < settings.min_preference_pairs or not train or not heldout:
        reason = (
            f"{settings.user} has {len(picks)} A/B picks ({pairs} pairs); {settings.min_preference_pairs} pairs "
            f"are needed (MAS_MIN_PREFERENCE_PAIRS) and at least {every} picks, so one can be held out. Until "
            "then the studio default serves (it expects every variation equally). Nothing was trained."
        )
        return TasteReport(user=settings.user, trained=False, promoted=False, reason=reason, picks=len(picks))
    candidate = fit(train, settings=settings)
    serving = fit(picks, settings=settings)
    current = served(settings)
    verdict = judge(candidate, current, heldout, settings=settings)
    heldout_pairs = sum(len(p.rejected) for p in heldout)
    with session_scope(settings) as session:
        version = 1 + int(session.scalar(
            sa.select(sa.func.coalesce(sa.func.max(TasteModel.version), 0)).where(TasteModel.user_name == settings.user)
        ))
        rule = ("it must beat the default by more than one standard error" if current.version is None else
                "a newer version replaces it unless worse by more than one standard error")
        reason = (
            f"taste v{version} {'promoted' if verdict.promote else 'kept on file, not promoted'}: on {heldout_pairs} "
            f"held-out pairs it is right {verdict.accuracy:.0%} (log-likelihood {verdict.log_likelihood:.3f} per "
            f"pair) against {verdict.current_accuracy:.0%} ({verdict.current_log_likelihood:.3f}) for "
            f"{current.name}; {rule} ({verdict.standard_error:.3f}). "
            f"{'What serves is' if verdict.promote else 'Kept with it:'} the same fit on all {len(picks)} picks."
        )
        session.add(TasteModel(
            user_name=settings.user, version=version, pairs_used=serving.pairs, heldout_pairs=heldout_pairs,
            heldout_accuracy=verdict.accuracy, promoted=verdict.promote, reason=reason,
            model={"served": serving.to_json(), "judged": candidate.to_json()},
        ))
    return TasteReport(
        user=settings.user, trained=True, promoted=verdict.promote, reason=reason, picks=len(picks),
        train_pairs=candidate.pairs, heldout_pairs=heldout_pairs, version=version,
        heldout_accuracy=verdict.accuracy, current_version=current.version,
        current_accuracy=verdict.current_accuracy, seconds=round(time.monotonic() - started, 2),
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


def expect(settings: Settings, options: Mapping[str, Option]) -> Expectation:
    """The variation `settings.user`'s served taste expects them to pick among `options` (by label)."""
    current = served(settings)
    if current.version is None:
        return Expectation(label=None, probability=None, by=f"no expectation: {current.name} serves {settings.user}")
    labels = sorted(options)
    probabilities = current.taste.choice_probabilities([options[label] for label in labels], settings=settings)
    best = int(np.argmax(probabilities))
    return Expectation(label=labels[best], probability=probabilities[best], by=current.name)


def ranker(settings: Settings):
    """A Writer ranker (`mas.agents.asking.Ranker`): candidate prompts scored by `settings.user`'s served
    taste (log-odds; with the default every candidate scores 0 and the model's first candidate wins)."""

    def rank(concept: str, prompts: Sequence[str]) -> list[float]:
        current = served(settings)
        if current.version is None:
            return [0.0] * len(prompts)
        return current.taste.logits([Option(prompt=p) for p in prompts], settings=settings).tolist()

    return rank
