"""The taste's pure parts (`mas.learning.taste`): its calibration, and a stored taste that today's features
cannot read. No server."""

from __future__ import annotations

import numpy as np
import pytest


def test_calibration_recovers_a_users_temperature_and_does_not_call_a_few_right_guesses_certain():
    from mas.learning.taste import _temperature

    rng = np.random.default_rng(0)
    logits = rng.normal(0, 2, 4000)
    chosen_first = rng.random(4000) < 1 / (1 + np.exp(-0.5 * logits))  # the user is half as sure as the logits
    assert _temperature(np.where(chosen_first, logits, -logits)) == pytest.approx(0.5, abs=0.05)
    few_all_right = np.abs(rng.normal(0, 1, 20))
    assert 1.0 < _temperature(few_all_right) < 10.0  # sharper, but a 21st pick can still surprise it


def test_a_taste_stored_with_an_interaction_over_other_phrase_features_reads_as_the_default():
    """A taste stored before the interaction read each phrase's own bucket (its latents had another length)
    cannot be read with today's interaction: the default serves until the next tune refits it."""
    from mas.learning.taste import FEATURES, PHRASE_BUCKETS, PairwiseTaste
    from mas.models import EMBEDDING_DIM

    stored = PairwiseTaste(weights=np.ones(len(FEATURES)), latents=np.ones(PHRASE_BUCKETS), pairs=4).to_json()
    assert not PairwiseTaste.from_json(stored).is_default
    assert PairwiseTaste.from_json({**stored, "latents": [1.0] * (EMBEDDING_DIM + PHRASE_BUCKETS)}).is_default
