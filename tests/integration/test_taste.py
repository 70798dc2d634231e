"""The taste per user (`mas.learning.taste`, `mas.learning.promotion`) on real PostgreSQL and the shipped MiniLM
embedder: it learns from picks, keeps users apart, refuses a worse version, and says why."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from mas.db import session_scope
from mas.domain.identity import STUDIO, Actor
from mas.learning.promotion import expect, served, tune_taste
from mas.learning.taste import Option
from mas.memory import blocks
from mas.models import ABSelection, ABTest

COLOURS = ("purple", "orange", "teal", "gold", "crimson", "silver")
CONCEPTS = ("a dragon", "a lighthouse", "a glacier", "a night market", "a comet", "a golem")


def _pick_rows(settings, actor, *, favourite: str, count: int, seed: int, flip=lambda position: False) -> None:  # noqa: ARG005
    """`count` A/B picks by `actor`, who picks the variation in `favourite` colours, stored as `mas
    pick` stores them; `flip(position)` makes that pick the other way round."""
    rng = random.Random(seed)
    with session_scope(settings) as session:
        already = session.query(ABSelection).filter(ABSelection.user_name == actor.user).count()
        for i in range(count):
            concept = rng.choice(CONCEPTS)
            other = rng.choice([c for c in COLOURS if c != favourite])
            liked, disliked = f"{concept}, {favourite} palette", f"{concept}, {other} palette"
            if flip(already + i):
                liked, disliked = disliked, liked
            test = ABTest(concept=concept, status="closed", winner_label="A", user_name=actor.user)
            session.add(test)
            session.flush()
            session.add(ABSelection(test_id=test.id, chosen_label="A", chosen_prompt=liked, rejected_prompts=[disliked],
                                    concept=concept, user_name=actor.user))


def _p_purple(settings, actor) -> float:
    options = {"A": Option(prompt="a hydra, purple palette"), "B": Option(prompt="a hydra, orange palette")}
    current = served(settings, actor)
    return current.taste.choice_probabilities(list(options.values()), settings=settings)[0]


def test_each_user_learns_their_own_taste_and_one_never_moves_the_other(clean):
    from mas.learning import preferences  # loads the Celery app: not at collection

    alice, bob = Actor("alice"), Actor("bob")
    _pick_rows(clean, alice, favourite="purple", count=24, seed=1)
    report = tune_taste(clean, alice)
    assert report.trained and report.promoted, report.reason
    assert report.judged_pairs == 24 and "over all 24 pairs of 24 picks" in report.reason
    learned = _p_purple(clean, alice)
    assert learned > 0.7  # a probability a person can read: purple over orange, on a concept never picked
    assert expect(clean, alice, {"A": Option(prompt="a hydra, orange palette"), "B": Option(prompt="a hydra, purple palette")}).label == "B"
    assert served(clean, bob).version is None and _p_purple(clean, bob) == 0.5  # bob starts from the studio default

    _pick_rows(clean, bob, favourite="orange", count=24, seed=2)
    assert tune_taste(clean, bob).promoted
    assert _p_purple(clean, bob) < 0.3
    assert served(clean, alice).version == 1 and _p_purple(clean, alice) == pytest.approx(learned)  # alice unchanged

    # the taste blocks are per user too; the studio's blocks stay shared
    preferences.learn_style(clean, alice, "I prefer dark moody aesthetics with purple and blue tones")
    assert "purple" in blocks.read(clean, alice, "user_style")["COLOR_PREFERENCES"]
    assert blocks.read(clean, bob, "user_style")["COLOR_PREFERENCES"] == ""
    assert blocks.read(clean, STUDIO, "user_style")["COLOR_PREFERENCES"] == ""
    blocks.set_field(clean, alice, "quality_standards", "MAX_RETRIES", "5")
    assert blocks.read(clean, bob, "quality_standards")["MAX_RETRIES"] == 5


def test_a_new_version_follows_picks_since_the_served_one_and_a_tune_with_none_changes_nothing(clean):
    carol = Actor("carol")
    _pick_rows(clean, carol, favourite="purple", count=24, seed=3)
    assert tune_taste(clean, carol).promoted and _p_purple(clean, carol) > 0.7
    again = tune_taste(clean, carol)
    assert not again.trained and "no pick since taste v1" in again.reason and served(clean, carol).version == 1

    # then she turns to orange: v1 never saw these picks and gets them wrong; v2, fitted on every pick and
    # judged on the new ones predicted without each, follows her
    _pick_rows(clean, carol, favourite="orange", count=48, seed=4)
    report = tune_taste(clean, carol)
    assert report.trained and report.promoted, report.reason
    assert report.judged_pairs == 48 and report.accuracy > report.current_accuracy
    assert "on the 48 pairs picked since taste v1 was fitted" in report.reason
    assert served(clean, carol).version == 2 and _p_purple(clean, carol) < 0.5


def test_promotion_refuses_a_version_that_is_worse_on_picks_it_did_not_train_on(clean):
    """The rule itself, on real fits: picks the serving version predicts well, a candidate that learned the
    reverse (its predictions on those picks are what cross-validation would give a version that got worse)."""
    from mas.learning.promotion import judge, load_picks
    from mas.learning.taste import fit

    liked, turned = Actor("gwen"), Actor("hal")
    _pick_rows(clean, liked, favourite="purple", count=24, seed=7)
    _pick_rows(clean, turned, favourite="purple", count=24, seed=8, flip=lambda position: True)  # noqa: ARG005
    picks = load_picks(clean, liked)
    serving, unseen = fit(picks[:16], settings=clean).taste, picks[16:]
    worse = fit(load_picks(clean, turned), settings=clean).taste
    current = serving.pair_log_likelihoods(unseen, settings=clean)
    candidate = worse.pair_log_likelihoods(unseen, settings=clean)
    one = np.arange(8)  # one pair per pick
    refused = judge(candidate, current, picks=one, against_default=False)
    assert not refused.promote and refused.accuracy < 0.5 < refused.current_accuracy
    # a candidate a little worse, within noise, replaces it: newer, fitted on more picks
    assert judge(current + np.r_[0.05, -0.07].repeat(4), current, picks=one, against_default=False).promote
    # leaving the default needs evidence: a coin flip's log-likelihood is not beaten by noise around it
    half = np.full(8, np.log(0.5))
    assert not judge(half + np.r_[0.2, -0.2].repeat(4), half, picks=one, against_default=True).promote
    assert judge(current, half, picks=one, against_default=True).promote
    # two pairs of one pick are not two pieces of evidence: the same differences, from 4 picks, are less sure
    differences = np.r_[0.4, -0.1, 0.3, -0.2].repeat(2)
    by_pair = judge(half + differences, half, picks=one, against_default=True)
    by_pick = judge(half + differences, half, picks=np.arange(4).repeat(2), against_default=True)
    assert by_pick.standard_error > by_pair.standard_error and by_pair.promote and not by_pick.promote


def test_a_user_with_no_picks_gets_the_default_and_a_clear_message(clean):
    from gpu.tuner import tune

    dave = Actor("dave")
    _pick_rows(clean, Actor("erin"), favourite="gold", count=12, seed=5)  # someone else's picks do not count
    report = tune(clean, dave)
    assert not report.trained and report.taste is None and report.pairs == 0
    assert "dave: 0 preference pairs" in report.reason and "studio default serves this user" in report.reason
    assert served(clean, dave).version is None
    assert expect(clean, dave, {"A": Option(prompt="x"), "B": Option(prompt="y")}).label is None


def test_a_user_name_that_cannot_name_rows_is_refused(clean):
    from click.testing import CliRunner

    from mas.cli.root import main

    result = CliRunner().invoke(main, ["style", "--user", "no spaces please", "I like purple"])
    assert result.exit_code == 2 and "user name" in result.output
    assert blocks.read(clean, STUDIO, "user_style")["COLOR_PREFERENCES"] == ""


@pytest.mark.usefixtures("clean")
def test_style_and_memory_commands_read_and_teach_the_named_user():
    from click.testing import CliRunner

    from mas.cli.root import main

    runner = CliRunner()
    taught = runner.invoke(main, ["style", "--user", "alice", "I prefer dark moody aesthetics with purple tones"])
    assert taught.exit_code == 0, taught.output
    alice = runner.invoke(main, ["memory", "show", "user_style", "--user", "alice"])
    studio = runner.invoke(main, ["memory", "show", "user_style"])
    assert "purple" in alice.output and "purple" not in studio.output


def test_a_version_stored_on_other_features_serves_as_the_default_until_refitted(clean):
    from mas.models import TasteModel

    frank = Actor("frank")
    with session_scope(clean) as session:
        session.add(TasteModel(user_name="frank", version=1, pairs_used=8, heldout_pairs=2, heldout_accuracy=1.0,
                               promoted=True, reason="an older release", model={"features": ["embedding[0]"],
                               "weights": [1.0], "pairs": 8, "regularisation": 1.0, "temperature": 1.0}))
    assert served(clean, frank).version is None
    assert expect(clean, frank, {"A": Option(prompt="x"), "B": Option(prompt="y")}).label is None
    _pick_rows(clean, frank, favourite="purple", count=24, seed=6)
    report = tune_taste(clean, frank)
    assert report.promoted and "studio default" in report.reason and served(clean, frank).version == 2




def test_a_taste_learns_which_colours_go_with_which_moods_which_no_sum_of_phrases_can_say(clean):
    """Warm palettes with energetic moods and cool ones with calm moods, the crossed pairs disliked: each
    colour and each mood is liked as often as disliked, so a sum of phrase weights predicts a guess. The
    interaction between phrases must carry it to a concept never picked."""
    from dataclasses import replace

    from mas.learning.taste import PairwiseTaste, Pick, fit

    warmth = {"orange": 1, "crimson": 1, "teal": -1, "silver": -1}
    energy = {"epic": 1, "cheerful": 1, "serene": -1, "melancholic": -1}

    def prompt(concept: str, colour: str, mood: str) -> str:
        return f"{concept}, {colour} palette, {mood} atmosphere"

    rng, picks = random.Random(0), []
    while len(picks) < 40:
        concept = rng.choice(CONCEPTS)
        (c1, m1), (c2, m2) = [(rng.choice(list(warmth)), rng.choice(list(energy))) for _ in range(2)]
        liking = warmth[c1] * energy[m1] - warmth[c2] * energy[m2]
        if liking:
            liked, disliked = ((c1, m1), (c2, m2)) if liking > 0 else ((c2, m2), (c1, m1))
            picks.append(Pick(selection_id=len(picks), concept=concept, chosen=Option(prompt=prompt(concept, *liked)),
                              rejected=(Option(prompt=prompt(concept, *disliked)),)))
    taste = fit(picks, settings=clean).taste
    assert taste.latents is not None and taste.interaction_strength is not None

    combinations = [(c, m) for c in warmth for m in energy]
    test = [(a, b) for a in combinations for b in combinations if warmth[a[0]] * energy[a[1]] > warmth[b[0]] * energy[b[1]]]

    def right(served) -> float:
        logits = served.logits([Option(prompt=prompt("a hydra", c, m)) for c, m in combinations], settings=clean)
        at = dict(zip(combinations, logits))
        return float(np.mean([at[a] > at[b] for a, b in test]))

    assert right(taste) >= 0.9
    assert right(replace(taste, latents=None)) <= 0.7  # the sum alone: about a guess
    stored = PairwiseTaste.from_json(json.loads(json.dumps(taste.to_json())))  # as a tune stores it
    assert stored.interaction_strength == taste.interaction_strength and right(stored) == right(taste)


