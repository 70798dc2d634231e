"""Which variations an A/B test shows (`mas.learning.ab_design`), on the shipped MiniLM embedder and real PostgreSQL:
the ones whose pick teaches the user's taste the most, decided on that user's picks alone."""

from __future__ import annotations

import random

from mas.agents.roles import Plan, PlannedVideo
from mas.db import session_scope
from mas.domain.identity import STUDIO, Actor
from mas.domain.requests import ProductionRequest
from mas.learning.ab_design import offer, proposals_request
from mas.learning.taste import Option, PairwiseTaste, features
from mas.models import ABSelection, ABTest, TasteModel

MOODS = ("serene", "epic", "melancholic", "whimsical", "gritty")
COLOURS = ("purple", "orange", "teal", "gold", "crimson", "silver")
PROPOSALS = [  # three that differ only in palette, three only in mood
    ("purple", "serene"), ("teal", "serene"), ("gold", "serene"),
    ("silver", "epic"), ("silver", "melancholic"), ("silver", "whimsical"),
]


def _compared(settings, actor, *, kind: str, count: int) -> None:
    """`count` picks by `actor` between two variations that differ only in mood (on a silver
    palette) or only in palette (in a serene mood), stored as `mas pick` stores them."""
    rng = random.Random(7)
    with session_scope(settings) as session:
        for _ in range(count):
            if kind == "mood":
                a, b = (f"silver palette, {m} atmosphere" for m in rng.sample(MOODS, 2))
            else:
                a, b = (f"{c} palette, serene atmosphere" for c in rng.sample(COLOURS, 2))
            test = ABTest(concept="a dragon", status="closed", winner_label="A", user_name=actor.user)
            session.add(test)
            session.flush()
            session.add(ABSelection(
                test_id=test.id, chosen_label="A", chosen_prompt=f"a dragon, slow dolly-in, {a}",
                rejected_prompts=[f"a dragon, slow dolly-in, {b}"], concept="a dragon", user_name=actor.user,
            ))


def _shown(settings, actor, *, count: int = 3) -> list[tuple[str, str]]:
    plan = Plan(videos=[PlannedVideo(concept="a comet", label=chr(ord("A") + i),
                                     approach=f"slow dolly-in, {c} palette, {m} atmosphere")
                        for i, (c, m) in enumerate(PROPOSALS)])
    shown = offer(plan, count=count, settings=settings, actor=actor)
    assert [v.label for v in shown.videos] == ["A", "B", "C"][:count]
    return [PROPOSALS[[f"slow dolly-in, {c} palette, {m} atmosphere" for c, m in PROPOSALS].index(v.approach)]
            for v in shown.videos]


def test_a_user_is_shown_variations_where_their_picks_have_not_been_yet(clean):
    design_only = clean.model_copy(update={"ab_explore": 0})
    alice, bob, carol = (Actor(name) for name in ("alice", "bob", "carol"))
    _compared(clean, alice, kind="mood", count=20)
    _compared(clean, carol, kind="palette", count=20)
    for_bob = _shown(design_only, bob)  # no picks: the most varied set
    for_alice, for_carol = _shown(design_only, alice), _shown(design_only, carol)
    assert len({c for c, _ in for_alice}) == 3  # alice has only compared moods: she is asked about palettes
    assert len({c for c, _ in for_bob}) < 3 and for_bob != for_alice  # and her picks never moved bob's design
    assert len({m for _, m in for_carol}) == 3  # carol has only compared palettes: she is asked about moods
    assert _shown(design_only, bob) == for_bob  # the same picks, the same design


def _promote(settings, actor, taste: PairwiseTaste) -> None:
    """Serve `taste` to `actor` as `mas tune` would once it was promoted."""
    with session_scope(settings) as session:
        session.add(TasteModel(user_name=actor.user, version=1, pairs_used=taste.pairs, heldout_pairs=0,
                               heldout_accuracy=None, promoted=True, reason="test",
                               model={"served": taste.to_json(), "last_pick": 0}))


def test_a_variation_the_served_taste_can_already_call_is_not_shown(clean):
    """A pick whose loser the studio knows in advance teaches little: with no pick at all, a user whose
    served taste is sure they dislike one palette is not shown it, while a user served the default is."""
    design_only = clean.model_copy(update={"ab_explore": 0})
    bob, dave = Actor("bob"), Actor("dave")
    for_bob = _shown(design_only, bob)
    disliked = for_bob[0][0]
    _promote(clean, dave, PairwiseTaste(weights=-30 * features([Option(prompt=f"{disliked} palette")], settings=clean)[0],
                                 pairs=1))
    for_dave = _shown(design_only, dave)
    assert disliked not in {c for c, _ in for_dave}, (for_bob, for_dave)
    assert len(for_dave) == 3 and _shown(design_only, bob) == for_bob


def test_one_variation_in_three_is_drawn_at_random_beside_the_designs_most_informative_pair(clean):
    """The design is blind to what the taste cannot say yet (how phrases combine), so by default one
    variation of three is drawn at random among the other proposals: repeatably for the same user and
    picks, differently for different ones."""
    alice = Actor("alice")
    _compared(clean, alice, kind="mood", count=20)
    pair = set(_shown(clean.model_copy(update={"ab_explore": 0}), alice, count=2))
    shown = _shown(clean, alice)
    assert len(set(shown)) == 3 and pair < set(shown) and _shown(clean, alice) == shown
    drawn = set()
    for name in ("bob", "carol", "dave", "erin", "frank", "grace"):  # no picks: the same pair for all
        user = Actor(name)
        user_pair = set(_shown(clean.model_copy(update={"ab_explore": 0}), user, count=2))
        user_shown = set(_shown(clean, user))
        assert user_pair < user_shown
        drawn |= user_shown - user_pair
    assert len(drawn) > 1
    assert set(_shown(clean.model_copy(update={"ab_explore": 2}), alice)) >= pair  # the design keeps two


def test_the_director_proposes_more_and_repeats_or_too_few_are_not_shown(clean):
    request = ProductionRequest(text="x", kind="ab", count=3, theme="a comet")
    assert proposals_request(request, settings=clean).count == 9  # MAS_AB_PROPOSALS=3 per variation shown
    assert proposals_request(request, settings=clean.model_copy(update={"ab_proposals": 1})).count == 3
    assert proposals_request(ProductionRequest(text="x", kind="ab", count=20, theme="a comet"), settings=clean).count == 26

    approaches = ["slow dolly-in", "Slow  dolly-in", "aerial drone sweep", "slow dolly-in", "macro detail shot"]
    plan = Plan(videos=[PlannedVideo(concept="a comet", label="x", approach=a) for a in approaches])
    shown = offer(plan, count=3, settings=clean, actor=STUDIO)
    assert sorted(v.approach.lower() for v in shown.videos) == ["aerial drone sweep", "macro detail shot", "slow dolly-in"]
    assert [v.label for v in shown.videos] == ["A", "B", "C"]
    too_few = offer(Plan(videos=plan.videos[:2] + plan.videos[3:4]), count=3, settings=clean, actor=STUDIO)
    assert [v.approach for v in too_few.videos] == ["slow dolly-in", "Slow  dolly-in", "slow dolly-in"]
