"""The studio's promises hold whatever the model answers: prompts that are prompts and carry the user's
style, reviews by the studio's rule, style feedback that keeps what it plainly says.

The model here is `tests/llm_faults.FaultyLLM`, a FAULT-INJECTING STAND-IN (not a model) scripted with the
answers a small real model gave (bench/RESULTS-seed-table.md): the task's own words, a prompt without the
palette, a review that never parses. The llm backend's real code talks to it over HTTP. That the same
promises hold on the real models is `tests/system/test_llm_agents.py` and `bench/seed_table_bench.py`.
"""

from __future__ import annotations

import json

from mas.agents import style_check
from mas.agents.llm import llm_agents
from mas.agents.roles import ReviewBrief, WriterBrief
from mas.agents.style import Style
from mas.config import Settings
from mas.domain.identity import STUDIO, Actor
from mas.learning.preferences import learn_style
from mas.memory import blocks
from tests.llm_faults import FaultyLLM

STYLE = {
    "COLOR_PREFERENCES": "purple, blue",
    "MOOD_PREFERENCES": "dark, moody",
    "PACING_PREFERENCES": "slow",
    "DISLIKED_ELEMENTS": ["bright aesthetics", "cheerful aesthetics", "warm orange and yellow tones", "fast cuts"],
}


def _applied(prompt: str) -> bool:
    return style_check.check(prompt, Style.of(STYLE)).applied


def _brief(**change) -> WriterBrief:
    fields = {
        "concept": "a phoenix rising from ashes, under moonlight",
        "attempt": 1,
        "user_style": STYLE,
        "series": {},
        "winning_patterns": [],
        "failure_patterns": [],
        "past_successes": [],
    }
    return WriterBrief(**{**fields, **change})


def _settings(settings: Settings, url: str) -> Settings:
    return settings.model_copy(
        update={
            "agent_backend": "llm",
            "llm_url": url,
            "llm_model": "stand-in",
            "llm_structured": "json_schema",
            "llm_reply_retries": 1,
            "llm_timeout_seconds": 10,
        }
    )


def _draft(prompt: str, negative: str = "") -> str:
    return json.dumps({"prompt": prompt, "negative_prompt": negative})


def _asked(llm: FaultyLLM, n: int) -> str:
    """The task message of request `n` (its last user message)."""
    return llm.requests[n]["messages"][-1]["content"]


# --- style learning ---------------------------------------------------------------------------------


FEEDBACK = "I prefer dark moody aesthetics with purple and blue tones"


def _items(stored: dict) -> set[tuple[str, str]]:
    return {(i["words"], i["polarity"]) for i in stored["ITEMS"]}


def test_a_reading_that_never_validates_is_not_understood_and_stores_nothing(clean):
    answers = [
        # SmolLM2-135M's answers: an old shape that reads nothing, the feedback handed back, the rule's own
        # words, a field name
        {"colors": "", "moods": "", "themes": "purple, blue-ish", "disliked": ["the opposite aesthetics"]},
        {"liked": [{"aspect": "theme", "words": "I prefer dark moody aesthetics with purple"}]},
        {"liked": [{"aspect": "mood", "words": "the opposite aesthetics the feedback rules out"}]},
        {"liked": [{"aspect": "colour", "words": "user_style"}], "ruled_out": []},
    ]
    for answer in answers:
        blocks.update(
            clean, STUDIO,
            "user_style",
            lambda v: {  # noqa: ARG005
                "ITEMS": [],
                "COLOR_PREFERENCES": "",
                "MOOD_PREFERENCES": "",
                "DISLIKED_ELEMENTS": [],
            },
            by="test",
        )
        with FaultyLLM([json.dumps(answer)]) as llm:
            stored = learn_style(_settings(clean, llm.url), STUDIO, FEEDBACK)
        # not read by the studio's rules instead: a model is configured, and its reading never validated
        assert _items(stored) == set(), (answer, stored)
        assert stored["COLOR_PREFERENCES"] == "" and stored["DISLIKED_ELEMENTS"] == [], stored


def test_a_valid_reading_is_stored_as_the_model_gave_it_even_what_the_studio_cannot_read(clean):
    answer = {
        "liked": [
            {"aspect": "colour", "words": "teal"},
            {"aspect": "mood", "words": "mysterious"},
            {"aspect": "theme", "words": "ocean depths"},
        ],
        "ruled_out": [{"aspect": "other", "words": "cartoonish characters"}],
    }
    with FaultyLLM([json.dumps(answer)]) as llm:
        stored = learn_style(_settings(clean, llm.url), STUDIO, "teal and mysterious ocean depths, nothing cartoonish")
    assert _items(stored) == {
        ("teal", "liked"),
        ("mysterious", "liked"),
        ("ocean depths", "liked"),
        ("cartoonish characters", "ruled_out"),
    }
    assert stored["THEME_PREFERENCES"] == "ocean depths" and stored["DISLIKED_ELEMENTS"] == ["cartoonish characters"]
    french = {"liked": [], "ruled_out": [{"aspect": "colour", "words": "red"}]}
    with FaultyLLM([json.dumps(french)]) as llm:
        stored = learn_style(_settings(clean, llm.url), STUDIO, "surtout pas de rouge, s'il vous plaît")
    assert ("red", "ruled_out") in _items(stored) and stored["ITEMS"][-1]["feedback"].startswith("surtout pas")


def test_a_valid_readings_polarity_is_the_models_even_where_the_studios_reader_reads_otherwise(clean):
    """The studio checks a reading's structure and grounding, never its polarity: its reader fits the
    sentences it was tuned on, a model reads language. The disagreement is recorded, not acted on."""
    inverted = {"liked": [{"aspect": "colour", "words": "red"}], "ruled_out": []}
    with FaultyLLM([json.dumps(inverted)]) as llm:
        stored = learn_style(_settings(clean, llm.url), STUDIO, "avoid any red, please")
    assert len(llm.requests) == 1
    assert _items(stored) == {("red", "liked")} and stored["COLOR_PREFERENCES"] == "red"


def test_a_later_feedback_overrides_an_earlier_one_and_a_new_user_starts_with_no_style(clean):
    learn_style(clean, STUDIO, "I love purple and slow shots")
    stored = learn_style(clean, STUDIO, "no purple at all")
    assert _items(stored) == {("slow", "liked"), ("purple", "ruled_out")}
    assert stored["ITEM_HISTORY"][-1]["words"] == "purple" and stored["ITEM_HISTORY"][-1]["was"] == "liked"
    assert "purple" in next(c.new for c in blocks.history(clean, STUDIO, "user_style") if c.field == "DISLIKED_ELEMENTS")
    newcomer = blocks.read(clean, Actor("newcomer"), "user_style")
    assert newcomer["ITEMS"] == [] and newcomer["COLOR_PREFERENCES"] == "" and newcomer["DISLIKED_ELEMENTS"] == []


# --- the Writer ---------------------------------------------------------------------------------------


def test_a_draft_missing_the_users_palette_is_asked_again_then_repaired_by_the_studio(clean):
    plain = "a phoenix rising from glowing ashes under moonlight, wings spread, slow motion"
    with FaultyLLM([_draft(plain)]) as llm:
        draft = llm_agents(_settings(clean, llm.url), STUDIO).writer.write(_brief())
    assert len(llm.requests) == 2  # the draft, then once more with what it misses
    asked_again = _asked(llm, 1)
    assert "your_last_prompt" in asked_again and "purple, blue, dark, moody" in asked_again
    assert draft.source == "repaired" and draft.prompt.startswith(plain)
    assert _applied(draft.prompt), draft.prompt
    assert "purple, blue" in draft.note and "bright aesthetics" in draft.negative_prompt


def test_a_correction_that_never_validates_leaves_the_draft_in_hand_to_be_repaired(clean):
    plain = "a phoenix rising from glowing ashes under moonlight, wings spread, slow motion"
    with FaultyLLM([_draft(plain), "not json"]) as llm:
        draft = llm_agents(_settings(clean, llm.url), STUDIO).writer.write(_brief())
    assert len(llm.requests) == 3  # the draft, then a correction asked twice (MAS_LLM_REPLY_RETRIES=1)
    assert draft.source == "repaired" and draft.prompt.startswith(plain) and _applied(draft.prompt)


def test_a_disliked_element_is_removed_and_a_model_that_fixes_its_draft_keeps_it(clean):
    bright = "a bright cheerful phoenix in warm orange light, purple and blue sky, dark moody clouds, slow reveal"
    fixed = "a phoenix of purple and blue fire rising from ashes, dark moody night, slow reveal"
    with FaultyLLM([_draft(bright)]) as llm:
        repaired = llm_agents(_settings(clean, llm.url), STUDIO).writer.write(_brief())
    assert repaired.source == "repaired" and _applied(repaired.prompt), repaired.prompt
    assert "phoenix" in repaired.prompt and "bright" not in repaired.prompt and "orange" not in repaired.prompt
    with FaultyLLM([_draft(bright), _draft(fixed)]) as llm:
        corrected = llm_agents(_settings(clean, llm.url), STUDIO).writer.write(_brief())
    assert "ruled out: bright aesthetics, cheerful aesthetics, warm orange and yellow tones" in _asked(llm, 1)
    assert corrected.source == "model" and corrected.prompt == fixed


def test_a_prompt_that_asks_for_a_video_instead_of_describing_one_is_not_a_prompt(clean):
    with FaultyLLM([_draft("Create a new video of a phoenix")]) as llm:
        draft = llm_agents(_settings(clean, llm.url), STUDIO).writer.write(_brief())
    assert "repeats the task's instructions" in _asked(llm, 1) and draft.source == "studio"


def test_a_draft_that_echoes_the_task_is_asked_again_then_the_studio_writes_its_own(clean):
    with FaultyLLM([_draft("write"), _draft("TASK: Write a short message to the studio's AI assistant")]) as llm:
        draft = llm_agents(_settings(clean, llm.url), STUDIO).writer.write(_brief())
    assert len(llm.requests) == 2 and "the prompt must show the concept" in _asked(llm, 1)
    assert draft.source == "studio" and "refused twice" in draft.note
    assert draft.prompt.startswith("a phoenix rising from ashes") and _applied(draft.prompt)


def test_a_write_that_never_validates_is_the_studios_prompt_from_the_concept_and_style(clean):
    with FaultyLLM(['{ "prompt": "re-match_scorer.json: refines the script']) as llm:  # cut mid-string
        draft = llm_agents(_settings(clean, llm.url), STUDIO).writer.write(_brief())
    assert len(llm.requests) == 2  # the reply and its one correction (MAS_LLM_REPLY_RETRIES=1)
    assert llm.requests[0]["max_tokens"] <= 400  # the write's own budget, not MAS_LLM_MAX_TOKENS
    assert draft.source == "studio" and "never validated" in draft.note
    assert "phoenix" in draft.prompt and _applied(draft.prompt)


def test_a_refinement_changes_the_prompt_toward_the_last_attempts_reasons(clean):
    before = "a phoenix of purple and blue fire rising from ashes, dark moody night, slow reveal"
    brief = _brief(attempt=2, previous_prompt=before, previous_failures=["jittery, unstable motion"])
    with FaultyLLM([_draft(before)]) as llm:  # the model hands back the same prompt
        draft = llm_agents(_settings(clean, llm.url), STUDIO).writer.write(brief)
    assert "must change the previous attempt's prompt" in _asked(llm, 1)
    assert draft.source == "studio" and draft.prompt != before and "steady camera, smooth slow motion" in draft.prompt
    changed = before + ", crisp detail"  # changed, but not toward the reason
    with FaultyLLM([_draft(changed)]) as llm:
        draft = llm_agents(_settings(clean, llm.url), STUDIO).writer.write(brief)
    # the correction names the reason (a check of the style may be asked first: "slow reveal" is near a rule-out)
    assert any("steady camera, smooth slow motion" in _asked(llm, n) for n in range(1, len(llm.requests)))
    assert draft.source == "repaired" and draft.prompt.startswith(changed)
    assert draft.prompt.endswith("steady camera, smooth slow motion")


# --- the Cameraman -------------------------------------------------------------------------------------


def test_a_review_that_never_validates_falls_back_to_the_studios_rule_with_the_graders_reasons(clean):
    weak = {"sharpness": 0.4, "smoothness": 0.9, "palette": 0.8, "total": 0.6}
    with FaultyLLM(["no idea"]) as llm:
        crew = llm_agents(_settings(clean, llm.url), STUDIO)
        above = crew.cameraman.review(ReviewBrief(grade="A", scores=weak, min_grade="B", attempt=1, max_retries=3))
        below = crew.cameraman.review(ReviewBrief(grade="D", scores=weak, min_grade="B", attempt=1, max_retries=3))
        last = crew.cameraman.review(ReviewBrief(grade="D", scores=weak, min_grade="B", attempt=3, max_retries=3))
    assert (above.action, above.source) == ("accept", "studio") and "never validated" in above.note
    assert (below.action, below.failure_reasons) == ("refine", ["noisy, soft frames"])
    assert below.strategy == "sharp focus, fine detail" and below.source == "studio"
    assert (last.action, last.failure_reasons) == ("fail", ["noisy, soft frames"])


def test_a_valid_review_is_judged_by_the_rule_and_its_reasons_kept_only_when_they_are_reasons(clean):
    weak = {"sharpness": 0.4, "smoothness": 0.9, "palette": 0.8, "total": 0.6}
    answer = {
        "action": "accept",
        "failure_reasons": ["failure_reasons", "B", "the wings blur into the smoke"],
        "strategy": "Refine with a strategy while attempt < max_retries, else failure",
    }
    with FaultyLLM([json.dumps(answer)]) as llm:
        verdict = llm_agents(_settings(clean, llm.url), STUDIO).cameraman.review(
            ReviewBrief(grade="D", scores=weak, min_grade="B", attempt=1, max_retries=3)
        )
    assert verdict.action == "refine" and verdict.source == "model"  # below the bar: never accepted
    assert verdict.failure_reasons == ["noisy, soft frames", "the wings blur into the smoke"]
    assert verdict.strategy == "sharp focus, fine detail"
