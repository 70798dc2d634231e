"""What the user teaches the studio directly: style feedback and A/B choices, each kept for `settings.user`."""

from __future__ import annotations

import json

import sqlalchemy as sa

from mas import agents
from mas.agents.style import Style, stamped
from mas.config import Settings
from mas.db import session_scope
from mas.errors import InvalidInput
from mas.learning.promotion import expect
from mas.learning.taste import Option
from mas.memory import blocks
from mas.models import ABSelection, ABTest, ABVariation, Attempt, Video, VideoState
from mas.text import check_storable


class PreferenceError(InvalidInput):
    """The feedback or choice can't be recorded; the message says why."""


HISTORY_SHOWN = 3
"""Changes of earlier items the block keeps however many items it holds (the rest are in its history)."""


def learn_style(settings: Settings, feedback: str) -> dict:
    """Director: read style feedback into items of `user_style` (liked or ruled out). A new item replaces
    every earlier one about the same thing, and the block's ITEM_HISTORY says which it turned round."""
    check_storable(feedback, "the style feedback")
    if not feedback.strip():
        raise PreferenceError('the feedback is empty: say what you like, e.g. "dark moody purple tones"')
    reading = agents.backend(settings).director.read_style(feedback)
    if not reading.items:
        raise PreferenceError(
            "I found no colour, mood, theme or pacing in that feedback, to like or to rule out; nothing "
            'changed. Try e.g. "I prefer dark moody aesthetics with purple and blue tones" or "no red"'
        )
    items = stamped(reading.items, feedback=feedback, at=blocks.now_iso())

    def change(v: dict) -> dict:
        style, changes = Style.of(v).learned(items)
        history = [*v.get("ITEM_HISTORY", []), *changes]
        fields = style.block_fields(history)
        # within the block's cap: the oldest changes go first down to the last few, then the oldest items
        # (never this feedback's), then the rest of the changes; every change stays in the block's history
        while len(json.dumps({**v, **fields})) > settings.memory.core_block_max_chars and (
            history or len(style.items) > len(items)
        ):
            if len(history) > HISTORY_SHOWN or (history and len(style.items) <= len(items)):
                history = history[1:]
            else:
                style = Style(items=style.items[1:])
            fields = style.block_fields(history)
        return fields

    return blocks.update(settings, "user_style", change, actor=f"director ({reading.source})")


def pick(settings: Settings, test_id: int, label: str) -> dict:
    """Record the user's winner of an A/B test: USER_SELECTIONS, WINNING_PATTERNS, a pick row (the pairs the
    taste and DPO learn from, with each video's scores), and, first, which variation the user's taste
    expected, so the gallery can say whether the studio was right."""
    label = label.strip().upper()
    with session_scope(settings) as session:
        test = session.execute(sa.select(ABTest).where(ABTest.id == test_id).with_for_update()).scalar_one_or_none()
        if test is None:
            raise PreferenceError(f"there is no A/B test {test_id}; nothing changed")
        if test.status != "open":
            raise PreferenceError(f"A/B test {test_id} is closed (winner {test.winner_label}); nothing changed")
        if test.user_name != settings.user:
            raise PreferenceError(
                f"A/B test {test_id} was made for {test.user_name}, not {settings.user}: pick it with "
                f"--user {test.user_name}; nothing changed"
            )
        variations = {v.label: v for v in session.scalars(sa.select(ABVariation).where(ABVariation.test_id == test_id))}
        if label not in variations:
            raise PreferenceError(
                f"A/B test {test_id} has no variation {label!r}; labels: {', '.join(sorted(variations))}"
            )
        videos = {
            v.id: v
            for v in session.scalars(sa.select(Video).where(Video.id.in_([x.video_id for x in variations.values()])))
        }
        unfinished = [v.id for v in videos.values() if v.state not in (VideoState.accepted, VideoState.failed)]
        if unfinished:
            raise PreferenceError(f"A/B test {test_id} is still rendering (videos {unfinished}); pick when it is done")

        def final(video: Video) -> Option:
            row = session.scalars(
                sa.select(Attempt).where(Attempt.video_id == video.id, Attempt.number == video.attempt_count)
            ).first()
            return Option(prompt=row.prompt if row else "", scores=dict(row.scores or {}) if row else {})

        options = {lbl: final(videos[v.video_id]) for lbl, v in sorted(variations.items()) if v.video_id is not None}
        expectation = expect(settings, options)
        test.expected_label, test.expected_probability, test.expected_by = (
            expectation.label,
            expectation.probability,
            expectation.by,
        )
        chosen = variations[label]
        rejected = [o for lbl, o in options.items() if lbl != label]
        session.add(
            ABSelection(
                test_id=test_id,
                chosen_label=label,
                chosen_prompt=options[label].prompt,
                chosen_scores=dict(options[label].scores),
                rejected_prompts=[o.prompt for o in rejected],
                rejected_scores=[dict(o.scores) for o in rejected],
                concept=test.concept,
                user_name=settings.user,
            )
        )
        test.status, test.winner_label = "closed", label
        selection = {"test": str(test_id), "label": label, "approach": chosen.approach, "concept": test.concept}
        return blocks.update(
            settings,
            "ab_testing",
            lambda v: {
                "USER_SELECTIONS": (v["USER_SELECTIONS"] + [selection])[-blocks.KEEP :],
                "WINNING_PATTERNS": list(dict.fromkeys(v["WINNING_PATTERNS"] + [chosen.approach]))[-blocks.KEEP :],
                "ACTIVE_TEST": None if v["ACTIVE_TEST"] == str(test_id) else v["ACTIVE_TEST"],
            },
            actor="user",
            session=session,
        )
