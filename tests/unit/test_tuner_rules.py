"""The Tuner's held-out choices (`gpu.tuner.split_heldout`): fixed by selection order. Pure code."""

from __future__ import annotations

from gpu.preference_model import PreferencePair
from gpu.tuner import split_heldout


def test_held_out_choices_are_fixed_by_selection_order():
    pairs = [PreferencePair(selection_id=sid, concept="c", chosen=f"x{sid}", rejected=f"y{sid}{k}")
             for sid in (3, 7, 9, 12, 20, 21, 30, 31) for k in range(2)]
    train, heldout = split_heldout(pairs, every=4)
    assert {p.selection_id for p in heldout} == {12, 31}  # the 4th and the 8th selection, both their pairs
    assert len(train) == 12 and not {p.selection_id for p in train} & {12, 31}
    later = PreferencePair(selection_id=40, concept="c", chosen="a", rejected="b")
    assert split_heldout([*pairs, later], every=4)[1] == heldout  # a new choice moves nothing already held out
