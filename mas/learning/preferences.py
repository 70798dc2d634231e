"""What the user teaches the studio directly: style feedback and A/B choices, each kept for the user it is for (the `Actor` every call names)."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from mas import agents
from mas.config import Settings
from mas.db import session_scope
from mas.domain.identity import Actor
from mas.errors import InvalidInput
from mas.learning import style_book
from mas.learning.promotion import expect
from mas.learning.taste import Option
from mas.memory import blocks
from mas.models import ABSelection, ABTest, ABVariation, Attempt, Video, VideoState
from mas.text import check_storable


class PreferenceError(InvalidInput):
    """The feedback or choice can't be recorded; the message says why."""


@dataclass(frozen=True, kw_only=True)
class Lesson:
    """What one feedback taught: who read it, the items stored and those turned round, what was not
    understood (quoted), and the `user_style` block after it."""

    feedback: str
    reader: str  # studio | model
    note: str
    stored: list[style_book.Entry]
    turned: list[dict[str, str]]
    not_understood: list[str]
    block: dict


def read_feedback(settings: Settings, actor: Actor, feedback: str) -> Lesson:
    """Director: read style feedback into the user's items (`mas.learning.style_book`), each liked or ruled
    out, the clauses it did not understand kept with the feedback and never stored as items."""
    check_storable(feedback, "the style feedback")
    if not feedback.strip():
        raise PreferenceError('the feedback is empty: say what you like, e.g. "dark moody purple tones"')
    reading = agents.backend(settings, actor).director.read_style(feedback)
    unread = list(reading.not_understood)
    if not reading.items and not unread and reading.source == "model":
        unread = [feedback]  # the model read nothing in it: the whole feedback is not understood
    if not reading.items and not unread:
        raise PreferenceError(
            "I found no colour, mood, theme or pacing in that feedback, to like or to rule out; nothing "
            'changed. Try e.g. "I prefer dark moody aesthetics with purple and blue tones" or "no red", or '
            'give an item as it is: mas style --avoid "handheld camera"'
        )
    changed = style_book.learn(
        settings, actor, reading.items, feedback=feedback, source=reading.source, not_understood=unread
    )
    return Lesson(
        feedback=feedback,
        reader=reading.source,
        note=reading.note,
        stored=changed.entries,
        turned=changed.turned,
        not_understood=unread,
        block=changed.block,
    )


def learn_style(settings: Settings, actor: Actor, feedback: str) -> dict:
    """`read_feedback`, answering the `user_style` block it leaves."""
    return read_feedback(settings, actor, feedback).block


def pick(settings: Settings, actor: Actor, test_id: int, label: str) -> dict:
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
        if test.user_name != actor.user:
            raise PreferenceError(
                f"A/B test {test_id} was made for {test.user_name}, not {actor.user}: pick it with "
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
        expectation = expect(settings, actor, options)
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
                user_name=actor.user,
            )
        )
        test.status, test.winner_label = "closed", label
        selection = {"test": str(test_id), "label": label, "approach": chosen.approach, "concept": test.concept}
        return blocks.update(
            settings,
            actor,
            "ab_testing",
            lambda v: {
                "USER_SELECTIONS": (v["USER_SELECTIONS"] + [selection])[-blocks.KEEP :],
                "WINNING_PATTERNS": list(dict.fromkeys(v["WINNING_PATTERNS"] + [chosen.approach]))[-blocks.KEEP :],
                "ACTIVE_TEST": None if v["ACTIVE_TEST"] == str(test_id) else v["ACTIVE_TEST"],
            },
            by="user",
            session=session,
        )
