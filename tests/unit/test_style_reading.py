"""The studio reads its user's words or says it did not understand them: no guessed polarity. A model's
reading stands on polarity; the studio checks only its structure and grounding. A prompt the studio cannot
read is checked by the model, or left unchecked and said so. Pure code: no server.

The roles are driven by `Scripted` (tests/unit/scripted.py): a stand-in for a model's transport that
validates each reply as the backends do.
"""

from __future__ import annotations

import pytest

from mas.agents import prompt_check, style_check, style_reader
from mas.agents.asking import AskingDirector, AskingWriter
from mas.agents.offline import OfflineDirector
from mas.agents.roles import WriterBrief
from mas.agents.style import Style, StyleItem
from mas.config import Settings
from mas.reports.queries import style_check_word
from tests.unit.scripted import Scripted


@pytest.fixture(scope="module")
def meaning():
    from mas.agents.meaning import StudioMeaning

    return StudioMeaning(Settings())


def understood(feedback: str) -> tuple[set[tuple[str, bool]], list[str]]:
    reading = style_reader.understand(feedback)
    return {(i.words, i.liked) for i in reading.items}, [u.text for u in reading.not_understood]


# --- the studio's own reader: what it accounts for, by construction class -----------------------------


@pytest.mark.parametrize(
    ("feedback", "items"),
    [
        ("no purple at all", {("purple", False)}),  # negation
        ("I love blue but I can't stand yellow", {("blue", True), ("yellow", False)}),  # contrast
        ("blue, but not navy", {("blue", True), ("navy", False)}),
        ("No red, orange or yellow", {("red", False), ("orange", False), ("yellow", False)}),
        ("less red, more blue", {("red", False), ("blue", True)}),
        ("crimson, yes! orange, never.", {("crimson", True), ("orange", False)}),
        ("pastels, but nothing too sweet", {("pastel", True), ("sweet", False)}),  # "too" strengthens "nothing"
        ("blue instead of red", {("blue", True), ("red", False)}),
        ("teal is fine", {("teal", True)}),
        ("navy and azure, melancholy", {("navy", True), ("azure", True), ("melancholy", True)}),  # a bare list
        ("I don't mind red", {("red", True)}),
    ],
)
def test_a_clause_the_reader_accounts_for_is_stored_with_its_polarity(feedback, items):
    assert understood(feedback) == (items, [])


@pytest.mark.parametrize(
    ("feedback", "unread"),
    [
        # swap: "swap A for B" is no cue the reader knows (A out, B in; "swap in A for B" the other way)
        ("swap the red for blue", ["swap the red for blue"]),
        ("replace the neon with earthy tones", ["replace the neon with earthy tones"]),
        # tense: a taste the same sentence drops
        ("I used to love neon but I'm over it now", ["I used to love neon", "but I'm over it now"]),
        ("red was my favourite, not anymore", ["red was my favourite", "not anymore"]),
        ("I hated the red", ["I hated the red"]),
        # double negative
        ("I don't dislike red", ["I don't dislike red"]),
        ("never without gold", ["never without gold"]),
        ("not too dark", ["not too dark"]),
        # idiom
        ("red is not my cup of tea", ["red is not my cup of tea"]),
        ("I can't get enough of teal", ["I can't get enough of teal"]),
        ("purple is growing on me", ["purple is growing on me"]),
        # comparison
        ("more orange than I'd like", ["more orange than I'd like"]),
        # a short sentence in another language with an English loanword
        ("kein Neon mehr", ["kein Neon mehr"]),
        ("geen pastel meer", ["geen pastel meer"]),
        ("basta neon", ["basta neon"]),
        # languages it has no word list for, and other scripts
        ("inget rött, tack", ["inget rött", "tack"]),
        ("不要红色", ["不要红色"]),
        ("pas de violet", ["pas de violet"]),
        # a pronoun whose polarity it cannot place: the bare "Red" beside it is not liked either
        ("Red. Can't stand it.", ["Red", "Can't stand it"]),
        ("nothing but blue", ["nothing", "but blue"]),
    ],
)
def test_what_the_reader_cannot_account_for_is_not_understood_never_guessed(feedback, unread):
    assert understood(feedback) == (set(), unread)


def test_a_clause_with_its_own_cue_stands_beside_one_not_understood():
    """ "too dark lately" has its cue; "can you go brighter" has no cue the reader knows: only that part is not
    understood (before, "brighter" was stored as liked for want of a cue)."""
    assert understood("too dark lately, can you go brighter?") == ({("dark", False)}, ["can you go brighter"])
    assert understood("I'd rather not have any red in there, it gives me anxiety") == (
        {("red", False)},
        ["it gives me anxiety"],
    )


def test_the_offline_director_returns_what_it_did_not_understand():
    reading = OfflineDirector().read_style("no red. I used to love neon")
    assert [(i.words, i.liked) for i in reading.items] == [("red", False)]
    assert reading.not_understood == ["I used to love neon"] and reading.source == "studio"


# --- the model's reading stands on polarity -------------------------------------------------------


def test_the_models_polarity_stands_where_the_studios_reader_reads_otherwise_and_that_is_recorded():
    """The studio's reader reads "I don't mind red" as liking red; a model that reads it as ruling red out is
    stored as it read it (the studio does not read language better than a model), and the disagreement with
    the studio's reader is recorded for the figures, never acted on."""
    model = {"ruled_out": [{"aspect": "colour", "words": "red"}]}
    reading = AskingDirector(Scripted(model)).read_style("I don't mind red")
    assert reading.source == "model" and [(i.words, i.liked) for i in reading.items] == [("red", False)]
    assert reading.disagreements and "red" in reading.disagreements[0]
    assert reading.not_understood == []


def test_a_reading_that_never_validates_is_not_understood_not_read_by_the_rules():
    junk = {"liked": [{"aspect": "theme", "words": "I prefer"}, {"aspect": "colour", "words": "user_style"}]}
    reading = AskingDirector(Scripted(junk)).read_style("avoid any red, please")
    assert reading.items == [] and reading.not_understood == ["avoid any red, please"]
    assert "never validated" in reading.note


def test_an_empty_reading_of_feedback_that_names_style_words_is_not_understood_and_not_asked_again():
    """A small model dodges with two empty lists: for "I hate neon pink" that would store nothing and say
    nothing. The studio sees that the feedback names pink and neon (no polarity read): the feedback is not
    understood, and shown so. It does not press the model again, which would push a model that cannot read it
    into a guess. Feedback with no style word may be read as empty."""
    empty = {"liked": [], "ruled_out": []}
    asker = Scripted(empty)
    reading = AskingDirector(asker).read_style("I hate neon pink")
    assert reading.items == [] and reading.not_understood == ["I hate neon pink"] and len(asker.asked) == 1
    assert "the feedback names neon, pink" in reading.note
    reading = AskingDirector(Scripted(empty)).read_style("great job, thanks")
    assert reading.items == [] and reading.not_understood == [] and reading.source == "model"


def test_an_item_is_grounded_in_the_models_english_for_a_feedback_in_another_language():
    """Swedish the studio does not read: the item must be in the model's English for it, whatever its
    polarity; an item from elsewhere is asked again, then the feedback is not understood."""
    right = {"ruled_out": [{"aspect": "colour", "words": "red"}]}
    asker = Scripted({"english": "no red, thanks"}, right)
    reading = AskingDirector(asker).read_style("inget rött, tack")
    assert [q.task for q in asker.asked] == ["translate", "read_style"]
    assert [(i.words, i.liked) for i in reading.items] == [("red", False)] and "no red, thanks" in reading.note
    elsewhere = {"liked": [{"aspect": "theme", "words": "fantasy"}]}
    reading = AskingDirector(Scripted({"english": "no red, thanks"}, elsewhere)).read_style("inget rött, tack")
    assert reading.items == [] and reading.not_understood == ["inget rött, tack"]


def test_a_liked_shade_beside_its_ruled_out_family_is_the_users_exception():
    """ "replace yellow by gold": yellow ruled out, gold liked; a prompt with gold is not refused for it."""
    both = {"liked": [{"aspect": "colour", "words": "gold"}], "ruled_out": [{"aspect": "colour", "words": "yellow"}]}
    reading = AskingDirector(Scripted(both)).read_style("replace yellow by gold")
    stored, _ = Style().learned(reading.items)
    assert {(i.words, i.liked) for i in stored.items} == {("gold", True), ("yellow", False)}
    check = style_check.check("a gold crown on a velvet cushion", stored)
    assert check.applied and not check.disliked
    assert style_check.check("a lemon yellow crown of gold", stored).disliked == ["yellow"]


# --- prompts the studio cannot read, and ruled-out phrases by meaning ---------------------------------

NO_HANDHELD = Style(
    items=(
        StyleItem(aspect="other", words="handheld camera", liked=False),
        StyleItem(aspect="colour", words="red", liked=False),
        StyleItem(aspect="colour", words="blue", liked=True),
    )
)


def test_a_ruled_out_item_of_several_words_is_judged_by_meaning_as_a_whole(meaning):
    shaky = "A fox trots through a snowy birch forest under a blue sky, filmed on a wobbly hand-held camcorder"
    assert style_check.check(shaky, NO_HANDHELD, meaning).disliked == ["handheld camera"]
    repaired = style_check.repair(shaky, NO_HANDHELD, meaning)
    assert "hand-held" not in repaired and style_check.check(repaired, NO_HANDHELD, meaning).applied, repaired


FRENCH = "un renard sous un ciel bleu, filmé caméra à l'épaule, bannières rouges"


def test_a_prompt_the_studio_cannot_read_is_checked_by_the_model_with_one_short_question(meaning):
    asker = Scripted({"shows_ruled_out": ["handheld camera", "red"], "misses_liked": []})
    check = prompt_check.checked(asker, FRENCH, NO_HANDHELD, meaning)
    assert check.by == "model" and check.checked and check.disliked == ["handheld camera", "red"]
    assert check.state == "refused" and [q.task for q in asker.asked] == ["check_style"]
    named_elsewhere = Scripted({"shows_ruled_out": ["yellow"]})  # not an item it was asked about
    unchecked = prompt_check.checked(named_elsewhere, FRENCH, NO_HANDHELD, meaning)
    assert not unchecked.checked and unchecked.state == "unchecked" and unchecked.as_json()["by"] == ""


def _brief(style: Style) -> WriterBrief:
    return WriterBrief(
        concept="a fox in the snow",
        attempt=1,
        user_style=style.block_fields(),
        series={},
        winning_patterns=[],
        failure_patterns=[],
        past_successes=[],
    )


def test_a_prompt_the_model_checks_and_finds_wanting_is_replaced_by_the_studios_own(meaning):
    """The studio cannot repair French; a French prompt that still shows a ruled-out item after one rewrite
    gives way to the studio's prompt. One that passes the model's check stands, its check kept."""
    bad = {"shows_ruled_out": ["red"], "misses_liked": []}
    asker = Scripted({"prompt": FRENCH}, bad, {"prompt": FRENCH}, bad)
    draft = AskingWriter(asker, meaning=meaning).write(_brief(NO_HANDHELD))
    assert draft.source == "studio" and style_check.check(draft.prompt, NO_HANDHELD, meaning).applied
    clean = "un renard sous un ciel bleu, plan fixe sur trépied"
    fine = Scripted({"prompt": clean}, {"shows_ruled_out": [], "misses_liked": []})
    draft = AskingWriter(fine, meaning=meaning).write(_brief(NO_HANDHELD))
    assert draft.source == "model" and draft.prompt == clean
    assert draft.style_check == {
        "checked": True,
        "by": "model",
        "applied": True,
        "missing": [],
        "disliked": [],
        "unsure": [],
    }


# --- a prompt the checks are not sure of: asked, never guessed ----------------------------------------

SKY = "A fox trots through a snowy birch forest under a blue sky"
SHAKY = f"{SKY}, shaky hand-held footage following close behind"  # 0.48 from "handheld camera"
STEADY = f"{SKY}, steady tripod shot of the valley"  # its opposite, 0.44: MiniLM cannot tell them apart
CLEAN = {"shows_ruled_out": [], "misses_liked": []}


@pytest.mark.parametrize("prompt", [SHAKY, STEADY])
def test_a_near_miss_is_neither_passed_nor_refused_by_the_rules_but_unchecked(meaning, prompt):
    """Without a model the prompt is recorded unchecked, its unsure item named, and shown as such."""
    check = style_check.check(prompt, NO_HANDHELD, meaning)
    assert check.unsure == ["handheld camera"] and not check.problems()
    assert check.state == "unchecked" and style_check_word(check.as_json()) == "unchecked"
    assert check.as_json()["unsure"] == ["handheld camera"]


def test_a_hyphenated_item_described_and_a_whole_prompt_near_a_ruled_out_theme_are_unsure(meaning):
    """A hyphenated item described in other words and a prompt about a ruled-out theme in none of its words:
    not sure, so asked or unchecked, never passed; a prompt about another theme that names the item only
    under a rule-out passes."""
    no_timelapse = Style(items=(StyleItem(aspect="other", words="time-lapse", liked=False),))
    sped_up = "A city at night, sped-up footage of traffic streaking past"
    assert style_check.check(sped_up, no_timelapse, meaning).unsure == ["time-lapse"]
    no_scifi = Style(items=(StyleItem(aspect="theme", words="sci-fi", liked=False),))
    invaded = "A kingdom of gold towers invaded by laser-firing spaceships and robot soldiers"
    assert style_check.check(invaded, no_scifi, meaning).unsure == ["sci-fi"]
    knights = "An epic fantasy quest across gold-lit plains, knights on horseback, no spaceships"
    assert style_check.check(knights, no_scifi, meaning).state == "applied"


def test_a_clause_of_words_the_rules_read_is_read_not_taken_for_a_description(meaning):
    """"tracking shot" says a tracking shot, not handheld camera, and "slow dolly-in" not slow motion, though
    MiniLM puts them near; such a clause names an item by its words ("static wide shot" is a static camera,
    "handheld close-up" a handheld camera: a shot is the camera's take)."""
    assert style_check.check(f"{SKY}, tracking shot", NO_HANDHELD, meaning).state == "applied"
    no_slow_motion = Style(items=(StyleItem(aspect="pacing", words="slow motion", liked=False),))
    assert style_check.check(f"{SKY}, slow dolly-in", no_slow_motion, meaning).state == "applied"
    no_static = Style(items=(StyleItem(aspect="other", words="static camera", liked=False),))
    assert style_check.check(f"{SKY}, static wide shot", no_static, meaning).disliked == ["static camera"]
    assert style_check.check(f"{SKY}, handheld close-up", NO_HANDHELD, meaning).disliked == ["handheld camera"]


def test_with_a_model_to_ask_the_band_reaches_lower_than_where_a_prompt_is_marked_unchecked(meaning):
    """A clause 0.3 from the item: below the edge where a prompt with no model is marked unchecked (it passes,
    as a camera phrase near a camera item would), above the edge where a model is asked."""
    operator = f"{SKY}, filmed by a camera operator walking and jostling through the crowd"
    assert style_check.check(operator, NO_HANDHELD, meaning).state == "applied"
    assert style_check.check(operator, NO_HANDHELD, meaning, asking=True).unsure == ["handheld camera"]
    named = Scripted({"shows_ruled_out": ["handheld camera"], "misses_liked": []})
    refused = prompt_check.checked(named, operator, NO_HANDHELD, meaning)
    assert refused.by == "model" and refused.disliked == ["handheld camera"] and len(named.asked) == 1


def test_a_near_miss_is_asked_of_the_model_of_its_unsure_items_only(meaning):
    named = Scripted({"shows_ruled_out": ["handheld camera"], "misses_liked": []})
    refused = prompt_check.checked(named, SHAKY, NO_HANDHELD, meaning)
    assert refused.by == "model" and refused.state == "refused" and refused.disliked == ["handheld camera"]
    (question,) = named.asked
    assert question.task == "check_style" and question.payload["prompt"] == SHAKY
    assert question.payload["ruled_out"] == ["handheld camera"] and question.payload["liked"] == []
    passed = prompt_check.checked(Scripted(CLEAN), STEADY, NO_HANDHELD, meaning)
    assert passed.by == "model" and passed.state == "applied" and passed.unsure == ["handheld camera"]
    off_list = Scripted({"shows_ruled_out": ["red"]})  # not the item it was asked about: no valid answer
    assert prompt_check.checked(off_list, SHAKY, NO_HANDHELD, meaning).state == "unchecked"


def test_a_clear_match_is_refused_and_an_unrelated_prompt_passed_by_the_rules_without_a_question(meaning):
    asker = Scripted(CLEAN)
    for prompt in (f"{SKY}, shot on a handheld camera", f"{SKY}, filmed on a wobbly hand-held camcorder"):
        check = prompt_check.checked(asker, prompt, NO_HANDHELD, meaning)
        assert check.by == "studio" and check.state == "refused" and check.disliked == ["handheld camera"]
    unrelated = prompt_check.checked(asker, SKY, NO_HANDHELD, meaning)
    assert unrelated.by == "studio" and unrelated.state == "applied" and not unrelated.unsure
    assert asker.asked == []


def test_the_writer_asks_of_a_near_miss_and_gives_way_when_the_model_names_the_item(meaning):
    named = {"shows_ruled_out": ["handheld camera"], "misses_liked": []}
    draft = AskingWriter(Scripted({"prompt": SHAKY}, named, {"prompt": SHAKY}), meaning=meaning).write(
        _brief(NO_HANDHELD)
    )
    assert draft.source == "studio" and "hand-held" not in draft.prompt, draft
    kept = AskingWriter(Scripted({"prompt": STEADY}, CLEAN), meaning=meaning).write(_brief(NO_HANDHELD))
    assert kept.source == "model" and kept.prompt == STEADY
    assert kept.style_check is not None and kept.style_check["by"] == "model" and kept.style_check["applied"]
