"""Issue 58's promise end to end: 15 users teach their style (`mas style` in plain English the studio's reader
understands, `--like` / `--avoid` as given, and feedback it does not understand, which stores nothing), then
each runs a batch on the offline agents and the preview renderer. Every prompt the render step received (the
attempts' prompts, what the video model is sent) carries each liked item and names no ruled-out one, even
where the user's own request or the studio's plan says it ("a red fox" for a user who ruled out red, "golden
mist" for one who ruled out gold)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from mas import db
from mas.cli import main
from mas.domain.identity import Actor
from mas.learning import style_book
from mas.models import Attempt, Batch, BatchStatus, Video
from tests.harness.processes import wait_for


@dataclass(frozen=True)
class User:
    name: str
    says: tuple[tuple[str, ...], ...]  # each a `mas style` command line after `--user NAME`
    request: str
    liked: frozenset[str] = frozenset()
    ruled_out: frozenset[str] = frozenset()
    not_understood: bool = False  # some of what they said is not understood, and none of that is stored


def user(name, says, request, *, liked=(), ruled_out=(), not_understood=False) -> User:
    return User(name, tuple(says), request, frozenset(liked), frozenset(ruled_out), not_understood)


USERS = [
    # read from plain English by the studio's reader
    user("ada", [("I love warm amber tones and a dreamy mood, but no red",)], "a red fox crossing a frozen lake",
         liked={"warm", "amber", "dreamy"}, ruled_out={"red"}),
    user("ben", [("I hate gold, love silver",)], "an old clock tower", liked={"silver"}, ruled_out={"gold"}),
    user("dan", [("keep it serene, avoid golden light",)], "a quiet harbour", liked={"serene"},
         ruled_out={"golden"}),
    user("eve", [("I like moody purple, never handheld camera",)], "a detective in a rainy alley",
         liked={"moody", "purple"}, ruled_out={"handheld camera"}),
    user("finn", [("please avoid pink; cheerful yellow is great",)], "a pink flamingo on a beach",
         liked={"cheerful", "yellow"}, ruled_out={"pink"}),
    user("gus", [("no neon colours, I prefer calm teal and slow pacing",)], "a city skyline at night",
         liked={"calm", "teal", "slow pacing"}, ruled_out={"neon"}),
    user("hana", [("I like slow pacing and melancholic mood, no green",)], "a pine forest in the rain",
         liked={"slow pacing", "melancholic"}, ruled_out={"green"}),
    user("jo", [("I want vibrant orange colours, not blue",)], "a whale under a blue sky",
         liked={"vibrant", "orange"}, ruled_out={"blue"}),
    # given as is
    user("cleo", [("--avoid", "mist", "--like", "film grain")], "a mountain village", liked={"film grain"},
         ruled_out={"mist"}),
    user("ivo", [("--avoid", "dawn", "--avoid", "lens flares", "--like", "slow dolly-in")], "a desert caravan",
         liked={"slow dolly-in"}, ruled_out={"dawn", "lens flares"}),
    # partly understood, the rest said again plainly
    user("nia", [("I love fast pacing and energetic mood, no mist",), ("--avoid", "mist")], "a waterfall",
         liked={"fast pacing", "energetic"}, ruled_out={"mist"}, not_understood=True),
    user("kai", [("swap the blues for greens",), ("--like", "green", "--avoid", "blue")], "a glacier lagoon",
         liked={"green"}, ruled_out={"blue"}, not_understood=True),
    # not understood: nothing stored, nothing enforced
    user("lea", [("I used to love red but now I'm over it",)], "a lighthouse at sunset", not_understood=True),
    user("max", [("Bitte kein Rot, ich liebe Blau",)], "a sailing boat", not_understood=True),
    user("oli", [("red is a no-go for me",), ("not a fan of grey",)], "a steam train in the hills",
         ruled_out={"grey"}, not_understood=True),
]  # fmt: skip


def mas(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def names(phrase: str, prompt: str) -> bool:
    """Whether `prompt` says `phrase` as words of its own (a plural, "golden" for gold, "reddish" for red)."""
    return re.search(rf"\b{re.escape(phrase)}(s|es|en|ish)?\b", prompt, re.IGNORECASE) is not None


def batches_ended(settings, batch_ids: list[int]) -> bool:
    with db.session_scope(settings) as s:
        statuses = s.scalars(sa.select(Batch.status).where(Batch.id.in_(batch_ids))).all()
    assert BatchStatus.failed not in statuses and BatchStatus.cancelled not in statuses, statuses
    return statuses.count(BatchStatus.done) == len(batch_ids)


@pytest.mark.usefixtures("workers")
def test_fifteen_users_prompts_carry_what_each_liked_and_nothing_they_ruled_out(clean):
    batches: dict[int, User] = {}
    for u in USERS:
        answers = "\n".join(mas("style", "--user", u.name, *said) for said in u.says)
        assert ("I did not understand:" in answers) == u.not_understood, answers
        stored = style_book.entries(clean, Actor(u.name))
        assert {e.words for e in stored if e.liked} == u.liked, (u.name, answers)
        assert {e.words for e in stored if not e.liked} == u.ruled_out, (u.name, answers)
        waited = mas("enqueue", "--user", u.name, f"Create 1 video of {u.request}")
        batches[int(waited.split()[1].rstrip(":"))] = u

    wait_for(lambda: batches_ended(clean, list(batches)), timeout=300, what="15 batches to end")

    with db.session_scope(clean) as s:
        rows = s.execute(
            sa.select(Video.batch_id, Attempt.prompt, Attempt.negative_prompt, Attempt.backend)
            .join(Video, Attempt.video_id == Video.id)
            .where(Video.batch_id.in_(list(batches)))
        ).all()
    rendered = [r for r in rows if r.backend == "preview"]  # what the video model received
    assert {r.batch_id for r in rendered} == set(batches), rows
    for r in rendered:
        u = batches[r.batch_id]
        shown = sorted(item for item in u.ruled_out if names(item, r.prompt))
        assert not shown, f"{u.name}'s prompt names what they ruled out, {shown}: {r.prompt!r}"
        missing = sorted(item for item in u.liked if not names(item, r.prompt))
        assert not missing, f"{u.name}'s prompt does not carry {missing}: {r.prompt!r}"
        # what was ruled out is what the video model is told to avoid
        assert all(names(item, r.negative_prompt) for item in u.ruled_out), (u.name, r.negative_prompt)
    # the requests that named a ruled-out item were rendered without it, not refused
    fox = next(r.prompt for r in rendered if batches[r.batch_id].name == "ada")
    assert "fox" in fox and "frozen lake" in fox, fox
