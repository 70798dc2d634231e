"""The studio understands its user's words: feedback read as meant, prompts judged by meaning, a model that
reads well is trusted. Pure code: no server; the checks use the MiniLM model the studio ships.

The roles are driven by `Scripted`, an in-process asker that answers each question with a given reply and
validates it exactly as the llm and Letta backends do (the reply model with the question's context); it is
a stand-in for a model's transport, not a model.
"""

from __future__ import annotations

import pytest

from mas.agents import checks, clauses, style_check, style_reader
from mas.agents.asking import AskingDirector, AskingWriter
from mas.agents.reading import as_reply
from mas.agents.roles import WriterBrief
from mas.agents.studio_rules import craft_of, studio_prompt
from mas.agents.style import Style, StyleItem
from mas.config import Settings
from mas.domain.requests import ProductionRequest
from tests.unit.scripted import Scripted


@pytest.fixture(scope="module")
def meaning():
    from mas.agents.meaning import StudioMeaning

    return StudioMeaning(Settings())


def said(feedback: str) -> tuple[set[str], set[str]]:
    items = style_reader.read(feedback)
    return {i.words for i in items if i.liked}, {i.words for i in items if not i.liked}


# --- the studio's own reader ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("feedback", "liked", "ruled_out"),
    [
        ("avoid any red, please", set(), {"red"}),
        ("no purple at all", set(), {"purple"}),
        ("I hate dark moody videos; I want bright cheerful colours", {"bright", "cheerful"}, {"dark", "moody"}),
        ("I don't like green", set(), {"green"}),
        ("never any red or orange", set(), {"red", "orange"}),
        ("I love blue but I can't stand yellow", {"blue"}, {"yellow"}),
        ("navy and azure, melancholy", {"navy", "azure", "melancholy"}, set()),
        ("No red, orange or yellow", set(), {"red", "orange", "yellow"}),
        ("less red, more blue", {"blue"}, {"red"}),
        ("crimson, yes! orange, never.", {"crimson"}, {"orange"}),
        ("I don't mind red", {"red"}, set()),
        ("I prefer dark moody aesthetics with purple and blue tones", {"dark", "moody", "purple", "blue"}, set()),
    ],
)
def test_the_studio_reads_negation_and_contrast_clause_by_clause_and_adds_no_opposite(feedback, liked, ruled_out):
    assert said(feedback) == (liked, ruled_out)


@pytest.mark.parametrize(
    "feedback",
    ["pas de violet", "nada de azul", "kein Rot, bitte", "紫は嫌い", "du violet et du doré", "rose et violet"],
)
def test_the_studio_says_nothing_about_languages_it_does_not_read(feedback):
    assert style_reader.read(feedback) == []


# --- the style as items -------------------------------------------------------------------------------


def test_a_later_feedback_turns_an_earlier_item_round_and_says_so():
    style, _ = Style().learned(style_reader.read("I love purple and slow shots"))
    style, changes = style.learned(style_reader.read("no purple at all"))
    assert {(i.words, i.liked) for i in style.items} == {("slow", True), ("purple", False)}
    assert changes == [{"words": "purple", "was": "liked", "now": "ruled_out: purple", "feedback": "", "at": ""}]
    style, _ = style.learned(style_reader.read("violet, please"))  # a shade of purple brings purple back
    assert {(i.words, i.liked) for i in style.items} == {("slow", True), ("violet", True)}
    fields = style.block_fields()
    assert fields["COLOR_PREFERENCES"] == "violet" and fields["DISLIKED_ELEMENTS"] == []


def test_text_an_operator_set_in_the_seed_fields_counts_as_items():
    style = Style.of({"COLOR_PREFERENCES": "teal, gold", "DISLIKED_ELEMENTS": ["fast cuts"]})
    assert {(i.aspect, i.words, i.liked) for i in style.items} == {
        ("colour", "teal", True),
        ("colour", "gold", True),
        ("pacing", "fast cuts", False),
    }


# --- prompts judged by meaning ------------------------------------------------------------------------

DARK_PURPLE = Style(
    items=tuple(style_reader.read("I prefer dark moody aesthetics with purple and blue tones, never bright"))
)


def test_a_prompt_that_carries_the_style_in_other_words_is_not_refused(meaning):
    prompt = "a dragon over a violet sea under a cobalt sky, brooding storm light, shadowy cliffs"
    assert style_check.check(prompt, DARK_PURPLE, meaning).applied


def test_a_liked_theme_is_what_the_whole_prompt_is_about(meaning):
    gothic = Style(items=tuple(style_reader.read("gothic please")))
    on_theme = "Ravens circle the pointed arches of a crumbling Victorian abbey draped in ebony velvet, slow dolly"
    off_theme = "A mysterious black cat wanders a modern glass office at night, slow tracking shot"
    assert style_check.check(on_theme, gothic, meaning).applied
    assert style_check.check(off_theme, gothic, meaning).missing == ["gothic"]


def test_a_prompt_that_misses_or_names_what_was_ruled_out_is_caught(meaning):
    check = style_check.check("a dragon over a sunny meadow of red poppies, bright daylight", DARK_PURPLE, meaning)
    assert set(check.missing) == {"dark", "moody", "purple", "blue"} and check.disliked == ["bright"]


def test_no_red_in_a_prompt_is_not_red_wanted_and_names_are_not_colours(meaning):
    no_red = Style(items=(StyleItem(aspect="colour", words="red", liked=False),))
    assert style_check.check("a fox in the snow at dusk, no red anywhere, slow pan", no_red, meaning).applied
    assert not style_check.check("a fox under scarlet banners at dusk", no_red, meaning).applied
    assert style_check.check("a fox in the Red Square at dusk, white snow", no_red, meaning).applied


def test_a_ruled_out_colour_covers_the_words_for_its_own_colour_not_its_neighbours(meaning):
    no_gold = Style(items=(StyleItem(aspect="colour", words="gold", liked=False),))
    golden = "a clock tower at dawn, low golden mist"
    assert style_check.check(golden, no_gold, meaning).disliked == ["gold"]
    assert style_check.repair(golden, no_gold, meaning) == "a clock tower at dawn, low mist"
    assert style_check.check("a clock tower at dusk, amber lamps", no_gold, meaning).applied  # amber is its own


@pytest.mark.parametrize(
    "prompt",
    [
        "un dragon au-dessus d'une mer violette sous un ciel cobalt, lumière d'orage sombre",
        "紫の海の上を飛ぶドラゴン、暗く陰鬱な嵐の光、ゆっくりとしたカメラ",
    ],
)
def test_a_prompt_in_a_language_the_checks_do_not_read_is_never_refused(prompt, meaning):
    check = style_check.check(prompt, DARK_PURPLE, meaning)
    assert not check.checked and not check.problems()
    assert style_check.repair(prompt, DARK_PURPLE, meaning) == prompt


def test_the_repair_cuts_whole_words_only_and_adds_what_is_missing_in_the_users_words(meaning):
    style = Style(
        items=(
            StyleItem(aspect="mood", words="bright", liked=False),
            StyleItem(aspect="mood", words="warm", liked=False),
            StyleItem(aspect="colour", words="orange", liked=False),
            StyleItem(aspect="colour", words="navy", liked=True),
        )
    )
    prompt = "a bright-eyed owl under a warm moon in Orange County"
    repaired = style_check.repair(prompt, style, meaning)
    assert repaired == "a bright-eyed owl under a moon in Orange County, navy colours"
    assert style_check.check(repaired, style, meaning).applied


@pytest.mark.parametrize(
    "prompt",
    [
        "a lighthouse in a storm, without any ships",
        "a lighthouse in a storm. This shot will avoid bright daylight.",
        "a lighthouse in a storm, no rain",
    ],
)
def test_what_the_repair_adds_is_never_read_under_the_prompts_last_rule_out(prompt, meaning):
    """Seen on SmolLM2 (a draft ending "... This prompt will ..."): the missing style added after a comma fell
    under the draft's last "without" or "avoid", so the stored prompt asked for no blue. What the repair adds
    starts a sentence of its own there; the rule-out still holds what it held."""
    style = Style(items=tuple(style_reader.read("I like moody blue tones")))
    repaired = style_check.repair(prompt, style, meaning)
    assert style_check.check(repaired, style, meaning).applied, repaired
    assert repaired.startswith(prompt.rstrip(". ")) and ". " in repaired[len(prompt.rstrip(". ")) :]


def test_the_studios_own_prompt_keeps_the_style_out_of_a_rule_out_in_the_concept(meaning):
    written = studio_prompt(
        _brief(concept="a harbour at night without any boats", failure_patterns=["noisy, soft frames"])
    )
    assert written.prompt.startswith("a harbour at night without any boats. "), written.prompt
    assert style_check.check(written.prompt, DARK_PURPLE, meaning).applied, written.prompt
    assert not any(w.ruled_out for w in clauses.read(written.prompt) if w.text in ("sharp", "purple")), written.prompt


def test_a_fix_the_draft_names_under_a_rule_out_is_still_missing():
    fixes = ["sharp focus, fine detail"]
    assert checks.missing_fixes("a fox in the snow, sharp focus, fine detail", fixes) == []
    assert checks.missing_fixes("a fox in the snow, without sharp focus or fine detail", fixes) == fixes


def test_the_writer_stores_no_prompt_whose_style_a_trailing_rule_out_takes_back(meaning):
    """A model that answers twice with a draft missing the style and ending on a rule-out: the repaired prompt
    carries the style, and the fixes of the last attempt's failures as well."""
    draft = "a dragon over the sea at night, without any ships"
    asker = Scripted({"prompt": draft}, {"prompt": draft})
    brief = _brief(attempt=2, previous_failures=["noisy, soft frames"])
    written = AskingWriter(asker, meaning=meaning).write(brief)
    assert written.source == "repaired" and written.prompt.startswith(draft), written.prompt
    assert style_check.check(written.prompt, DARK_PURPLE, meaning).applied, written.prompt
    assert "sharp focus" in written.prompt and not any(
        w.ruled_out for w in clauses.read(written.prompt) if w.text == "sharp"
    ), written.prompt


# --- the model's reading stands when it validates ---------------------------------------------------


LABELLED = [
    ("I love blue but I can't stand yellow", [("colour", "blue", True), ("colour", "yellow", False)]),
    (
        "teal and mysterious ocean depths, nothing cartoonish",
        [
            ("colour", "teal", True),
            ("mood", "mysterious", True),
            ("theme", "ocean depths", True),
            ("other", "cartoonish characters", False),
        ],
    ),
    ("j'adore le bleu marine mais pas de rouge", [("colour", "navy", True), ("colour", "red", False)]),
    (
        "紫と青が好き、明るすぎるのは嫌",
        [("colour", "purple", True), ("colour", "blue", True), ("mood", "bright", False)],
    ),
    ("nada de azul", [("colour", "blue", False)]),
]


@pytest.mark.parametrize(("feedback", "label"), LABELLED)
def test_a_capable_models_reading_is_stored_as_it_is(feedback, label):
    items = [StyleItem(aspect=a, words=w, liked=liked) for a, w, liked in label]
    reading = AskingDirector(Scripted(as_reply(items))).read_style(feedback)
    assert reading.source == "model" and reading.items == items


def test_a_reading_against_what_the_studios_reader_reads_stands_and_the_disagreement_is_recorded():
    """Before, the studio refused a reading whose polarity differed from its own reader's and stored its own:
    on text written apart from its word lists that turned a correct model's reading round. The model reads
    language; its polarity stands."""
    inverted = {"liked": [{"aspect": "colour", "words": "red"}], "ruled_out": []}
    asker = Scripted(inverted)
    reading = AskingDirector(asker).read_style("avoid any red, please")
    assert reading.source == "model" and [(i.words, i.liked) for i in reading.items] == [("red", True)]
    assert len(asker.asked) == 1 and reading.disagreements


def test_a_reading_of_another_language_is_grounded_in_the_models_own_english():
    """The studio reads no French: the model's English for it grounds the reading (an item must be in it);
    its polarity is the model's, the studio's reading of that English only recorded beside it. English
    feedback is never sent for translation."""
    inverted = {"liked": [{"aspect": "colour", "words": "violet"}]}
    asker = Scripted({"english": "no violet, please"}, inverted)
    reading = AskingDirector(asker).read_style("pas de violet, s'il vous plaît")
    assert [q.task for q in asker.asked] == ["translate", "read_style"]
    assert reading.source == "model" and [(i.words, i.liked) for i in reading.items] == [("violet", True)]
    assert "no violet, please" in reading.note and reading.disagreements
    right = {"ruled_out": [{"aspect": "colour", "words": "violet"}]}
    english = Scripted(right)
    reading = AskingDirector(english).read_style("no violet, please")
    assert [q.task for q in english.asked] == ["read_style"] and not reading.disagreements


def test_without_english_the_studio_can_read_a_foreign_reading_stands_on_its_structure():
    """An English the studio cannot read (more French) is no English: the reading is checked for its structure
    only, as the studio cannot say what the feedback means."""
    asker = Scripted(
        {"english": "pas de violet"}, {"english": "sans violet"}, {"liked": [{"aspect": "colour", "words": "violet"}]}
    )
    reading = AskingDirector(asker).read_style("pas de violet, s'il vous plaît")
    assert [q.task for q in asker.asked] == ["translate", "translate", "read_style"]
    assert reading.source == "model" and reading.note == ""


# --- the Writer and the Director --------------------------------------------------------------------


def _brief(**change) -> WriterBrief:
    fields = {
        "concept": "a dragon over the sea",
        "attempt": 1,
        "user_style": DARK_PURPLE.block_fields(),
        "series": {},
        "winning_patterns": [],
        "failure_patterns": [],
        "past_successes": [],
    }
    return WriterBrief(**{**fields, **change})


def test_a_prompt_in_japanese_stays_the_models(meaning):
    japanese = "紫の海の上を飛ぶドラゴン、暗く陰鬱な嵐の光、ゆっくりとしたカメラ"
    draft = AskingWriter(Scripted({"prompt": japanese}), meaning=meaning).write(_brief())
    assert draft.source == "model" and draft.prompt == japanese


def test_a_prompt_in_other_words_stays_the_models(meaning):
    prompt = "a dragon glides over a violet sea under a cobalt sky, brooding storm light, shadowy cliffs"
    asker = Scripted({"prompt": prompt})
    draft = AskingWriter(asker, meaning=meaning).write(_brief())
    assert draft.source == "model" and draft.prompt == prompt and len(asker.asked) == 1


@pytest.mark.parametrize(
    "handed_back",
    [
        "Create 2 videos of dragons, purple, blue colours, dark, moody mood",
        "dragons over a violet sea, brooding light. prompt: Create 3 videos of dragons",
    ],
)
def test_a_prompt_that_hands_the_request_or_its_field_back_is_asked_again(handed_back, meaning):
    """Seen on SmolLM2: the request, or the reply's own "prompt:" label, inside the prompt. Asked again; a
    video game or a slow-motion video in a scene is no request."""
    good = "dragons over a violet sea under a cobalt sky, brooding storm light, a slow-motion video of wings"
    asker = Scripted({"prompt": handed_back}, {"prompt": good})
    draft = AskingWriter(asker, meaning=meaning).write(_brief(concept="dragons"))
    assert draft.prompt == good and len(asker.asked) == 2


def test_a_plan_concept_that_is_a_field_name_or_markup_is_the_studios(meaning):
    request = ProductionRequest(
        kind="batch", theme="mythical creatures", count=3, text="3 videos of mythical creatures"
    )
    videos = [
        {"concept": "a phoenix rising from glowing ashes"},
        {"concept": "strategy&#34;"},
        {"concept": "consistency_rules"},
    ]
    plan = AskingDirector(Scripted({"videos": videos}), meaning=meaning).plan(request)
    concepts = [v.concept for v in plan.videos]
    assert concepts[0] == "a phoenix rising from glowing ashes"
    assert all("strategy" not in c and "&#" not in c and "_" not in c for c in concepts)
    assert all("mythical creatures" in c for c in concepts[1:])


def test_past_successes_teach_how_they_were_made_never_their_subject():
    success = "lighthouses in a storm, slow dolly-in, golden hour light, purple and blue colours"
    assert craft_of([success]) == ["slow dolly-in", "golden hour light"]
    prompt = studio_prompt(_brief(concept="a fox in the snow", past_successes=[success])).prompt
    assert "lighthouse" not in prompt and "slow dolly-in" in prompt


def test_the_reply_text_is_stored_as_the_model_meant_it_not_html_escaped():
    draft = AskingWriter(
        Scripted({"prompt": "a dragon &amp; a knight at dusk, violet and cobalt sky, brooding shadowy light"})
    )
    assert draft.write(_brief()).prompt == "a dragon & a knight at dusk, violet and cobalt sky, brooding shadowy light"


def test_the_feedback_handed_back_as_an_item_is_not_a_reading():
    handed_back = {"liked": [{"aspect": "mood", "words": "a bit too bright for me"}]}
    reading = AskingDirector(Scripted(handed_back)).read_style("a bit too bright for me")
    assert reading.items == [] and reading.not_understood == ["a bit too bright for me"]


def test_a_reading_of_another_feedback_is_not_a_reading_of_this_one():
    """A small model hands back an earlier feedback's reading: nothing in it is what this feedback names."""
    elsewhere = {"liked": [{"aspect": "mood", "words": "tense thriller energy"}]}
    reading = AskingDirector(Scripted(elsewhere)).read_style("not red.")
    assert reading.items == [] and reading.not_understood == ["not red."]
    in_other_words = {"ruled_out": [{"aspect": "colour", "words": "crimson"}]}
    reading = AskingDirector(Scripted(in_other_words)).read_style("not red.")
    assert reading.source == "model" and [(i.words, i.liked) for i in reading.items] == [("crimson", False)]
    synonym = {"liked": [{"aspect": "mood", "words": "dark"}]}  # a synonym of what the feedback says
    reading = AskingDirector(Scripted(synonym)).read_style("something gloomy please")
    assert reading.source == "model" and [(i.words, i.liked) for i in reading.items] == [("dark", True)]


@pytest.mark.parametrize(
    ("feedback", "handed_back", "stands"),
    [  # SmolLM2-135M's readings on the labelled set, each inverted
        ("nothing dark, ever", "dark, ever", False),
        ("don't make it eerie or creepy", "don't make it eerie or creepy", False),
        ("blue instead of red", "blue instead of red", False),
        ("more close-ups, fewer wide shots", "more close-ups, fewer wide shots", False),
        ("more nature, less city", "more nature, less city", False),
        ("less neon, more earthy", "less neon, more earthy", False),
        ("no to khaki and olive", "khaki and olive", True),
    ],
)
def test_a_clause_handed_back_as_an_item_is_no_reading_and_a_polarity_that_stands_is_recorded(
    feedback, handed_back, stands
):
    """An item that carries the feedback's own words of polarity (more, less, instead, never) is the clause
    handed back, refused by its structure: the feedback is then not understood, never read by the rules.
    "khaki and olive" liked is a preference in structure: the model's polarity stands, its disagreement with
    the studio's reader recorded."""
    inverted = {"liked": [{"aspect": "other", "words": handed_back}]}
    reading = AskingDirector(Scripted(inverted)).read_style(feedback)
    if stands:
        assert [(i.words, i.liked) for i in reading.items] == [(handed_back, True)] and reading.disagreements
    else:
        assert reading.items == [] and reading.not_understood == [feedback]


@pytest.mark.parametrize(
    ("feedback", "handed_back"),
    [  # SmolLM2-135M's readings on the labelled set: an earlier feedback of its conversation handed back
        ("whatever you think", ["fantasy stuff with lots of gold", "amethyst tones with a mysterious mood"]),
        (
            "I love the color blue, I love the color green, I love the color purple",
            ["fantasy stuff with lots of gold", "amethyst tones with a mysterious mood"],
        ),
        ("I really dislike slow videos", ["amethyst tones with a mysterious mood", "azure, serene, unhurried"]),
    ],
)
def test_an_item_that_is_nowhere_in_the_feedback_is_not_a_reading(feedback, handed_back):
    elsewhere = {"liked": [{"aspect": "other", "words": words} for words in handed_back]}
    reading = AskingDirector(Scripted(elsewhere)).read_style(feedback)
    assert reading.items == [] and reading.not_understood == [feedback]
    said = {"liked": [{"aspect": "theme", "words": "sunset"}, {"aspect": "pacing", "words": "slow"}]}
    reading = AskingDirector(Scripted(said)).read_style("warm tones, sunsets, slow pacing")  # plural or not
    assert reading.source == "model"


def test_a_colour_of_a_family_the_feedback_rules_out_stands_recorded_and_a_family_on_both_sides_is_read():
    amethyst = {"liked": [{"aspect": "colour", "words": "amethyst"}]}
    reading = AskingDirector(Scripted(amethyst)).read_style("without violet or lavender")
    assert [(i.words, i.liked) for i in reading.items] == [("amethyst", True)] and reading.disagreements
    both = {"liked": [{"aspect": "colour", "words": "blue"}], "ruled_out": [{"aspect": "colour", "words": "navy"}]}
    reading = AskingDirector(Scripted(both)).read_style("blue, but not navy")
    assert reading.source == "model" and [(i.words, i.liked) for i in reading.items] == [
        ("blue", True),
        ("navy", False),
    ]


@pytest.mark.parametrize(
    ("feedback", "reading"),
    [  # SmolLM2-135M's readings on the labelled set: a colour added that the feedback never names, where a word
        # of a polarity cue ("stand" of "can't stand"), a plural or "else" kept the studio from checking
        ("I love blue but I can't stand yellow", {"liked": ["blue"], "ruled_out": ["yellow", "green"]}),
        ("Black. Only black. Nothing else.", {"liked": ["black", "grey", "white"]}),
        ("pastels, but nothing too sweet", {"liked": ["pastels", "ocean themes"]}),
    ],
)
def test_an_item_the_feedback_never_names_is_not_a_reading_where_the_studio_knows_every_word(feedback, reading):
    given = {key: [{"aspect": "other", "words": w} for w in words] for key, words in reading.items()}
    read = AskingDirector(Scripted(given)).read_style(feedback)
    assert read.items == [] and read.not_understood == [feedback]


def test_a_foreign_sentence_copied_as_an_item_is_not_a_reading():
    """ "Never yellow nor orange" in Spanish, liked whole: the sentence handed back, not a preference."""
    copied = {"liked": [{"aspect": "colour", "words": "nunca amarillo ni naranja"}]}
    reading = AskingDirector(Scripted(copied)).read_style("nunca amarillo ni naranja")
    assert reading.items == [] and reading.not_understood == ["nunca amarillo ni naranja"]


@pytest.mark.parametrize(("feedback", "words"), [("something chilling please", "eerie"), ("make it pop", "vibrant")])
def test_an_item_that_may_be_a_synonym_of_a_word_the_studio_does_not_know_stands(feedback, words):
    reading = AskingDirector(Scripted({"liked": [{"aspect": "mood", "words": words}]})).read_style(feedback)
    assert reading.source == "model" and [(i.words, i.liked) for i in reading.items] == [(words, True)]
