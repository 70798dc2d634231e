"""The whitepaper's 8 use cases end to end: real Redis, Postgres + pgvector, a cpu and a gpu worker."""

import re
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from mas import db
from mas.cli import main
from mas.domain.identity import STUDIO, Actor
from mas.memory import blocks
from mas.models import ABSelection, ArchivalPassage, Attempt, Batch, BatchStatus, Video, VideoState


def run_cli(*args: str):
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result


def wait_batch(settings, batch_id: int, timeout: float = 180) -> Batch:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with db.session_scope(settings) as s:
            batch = s.get(Batch, batch_id)
            if batch.status == BatchStatus.done:
                return batch
        time.sleep(0.5)
    raise TimeoutError(f"batch {batch_id} did not finish")


def videos_of(settings, batch_id: int) -> list[Video]:
    with db.session_scope(settings) as s:
        return list(s.scalars(sa.select(Video).where(Video.batch_id == batch_id).order_by(Video.position)))


def attempts_of(settings, video_id: int) -> list[Attempt]:
    with db.session_scope(settings) as s:
        return list(s.scalars(sa.select(Attempt).where(Attempt.video_id == video_id).order_by(Attempt.number)))


def submit(*args: str) -> int:
    """Run a `mas` command that submits a batch (enqueue, series, ab); the batch's id."""
    result = run_cli(*args)
    assert result.exit_code == 0, result.output
    return int(result.output.split()[1].rstrip(":"))


def enqueue(request: str) -> int:
    return submit("enqueue", request)


@pytest.mark.usefixtures("workers")
def test_batch_production(clean):
    batch_id = enqueue("Create 4 videos of mythical creatures")
    wait_batch(clean, batch_id)
    videos = videos_of(clean, batch_id)
    assert len(videos) == 4 and len({v.concept for v in videos}) == 4
    assert all(v.state in (VideoState.accepted, VideoState.failed) for v in videos)
    for v in videos:
        if v.state == VideoState.accepted:
            assert Path(v.output_path).stat().st_size > 1000
    queue = blocks.read(clean, STUDIO, "production_queue")
    assert queue["BATCH_ID"] == str(batch_id) and queue["BATCH_TOTAL"] == 4 and queue["BATCH_COMPLETE"] == 4
    assert queue["PENDING_VIDEOS"] == [] and queue["QUEUE_STATUS"] == "complete"
    assert {e["video_id"] for e in queue["COMPLETED_TODAY"]} == {v.id for v in videos if v.state == VideoState.accepted}
    with db.session_scope(clean) as s:  # an archival entry for every attempt
        n_attempts = s.scalar(
            sa.select(sa.func.count()).select_from(Attempt).join(Video).where(Video.batch_id == batch_id)
        )
        assert (
            s.scalar(
                sa.select(sa.func.count())
                .select_from(ArchivalPassage)
                .where(ArchivalPassage.tags.contains(["quality"]))
            )
            == n_attempts
        )


@pytest.mark.usefixtures("workers")
def test_style_learning_and_personalization(clean):
    """Feedback read as meant (the offline rules): what the user liked reaches every prompt of their next
    batch, nothing they ruled out does, and no opposite they never said is stored."""
    result = run_cli("style", "I prefer dark moody aesthetics with purple and blue tones")
    assert result.exit_code == 0, result.output
    result = run_cli("style", "avoid any red, and I can't stand yellow; slow pacing please")
    assert result.exit_code == 0, result.output
    style = blocks.read(clean, STUDIO, "user_style")
    assert style["COLOR_PREFERENCES"] == "purple, blue" and style["MOOD_PREFERENCES"] == "dark, moody"
    assert style["DISLIKED_ELEMENTS"] == ["red", "yellow"] and "slow" in style["PACING_PREFERENCES"]
    batch_id = enqueue("Create 2 videos of red foxes in yellow autumn leaves")
    wait_batch(clean, batch_id)
    for video in videos_of(clean, batch_id):
        for attempt in attempts_of(clean, video.id):
            said = set(re.findall(r"[a-z]+", attempt.prompt.lower()))
            assert {"purple", "blue", "dark", "moody", "slow", "foxes"} <= said, attempt.prompt
            assert not said & {"red", "yellow"}, attempt.prompt  # ruled out, even where the request named them
            assert {"red", "yellow"} <= set(attempt.negative_prompt.split(", ")), attempt.negative_prompt
            assert attempt.style_check["checked"] and attempt.style_check["applied"], attempt.style_check


@pytest.mark.usefixtures("workers")
def test_quality_refinement_loop_learns_failure_patterns(clean):
    batch_id = enqueue("Create a video of a lighthouse")
    wait_batch(clean, batch_id)
    (video,) = videos_of(clean, batch_id)
    attempts = attempts_of(clean, video.id)
    # the first attempt of a studio with no learned patterns is weak and is refined
    assert len(attempts) >= 2 and attempts[0].grade in ("C", "D", "F") and attempts[0].failure_reasons
    assert video.state == VideoState.accepted and video.grade in ("A", "B")
    assert "sharp focus" in attempts[-1].prompt  # the Writer fixed what the Cameraman named
    quality = blocks.read(clean, STUDIO, "quality_standards")
    assert set(attempts[0].failure_reasons) <= set(quality["FAILURE_PATTERNS_TO_AVOID"])
    assert quality["REFINEMENT_STRATEGIES"]
    # learned patterns prevent the same mistake: the next video passes on its first attempt
    second = enqueue("Create a video of a windmill")
    wait_batch(clean, second)
    (next_video,) = videos_of(clean, second)
    assert next_video.attempt_count == 1 and next_video.state == VideoState.accepted


@pytest.mark.usefixtures("workers")
def test_multi_round_refinement_gives_up_after_max_retries(clean):
    assert run_cli("memory", "set", "quality_standards", "MIN_ACCEPTABLE_GRADE", "A").exit_code == 0
    assert run_cli("memory", "set", "quality_standards", "MAX_RETRIES", "2").exit_code == 0
    # palette adherence of an unnamed-colour prompt stays below A whatever the Writer adds
    batch_id = enqueue("Create 2 videos of an orange, red and green carnival")
    wait_batch(clean, batch_id)
    videos = videos_of(clean, batch_id)
    for video in videos:
        attempts = attempts_of(clean, video.id)
        assert 1 <= len(attempts) <= 2 and all(a.grade for a in attempts)
        assert [a.number for a in attempts] == list(range(1, len(attempts) + 1))
    failed = [v for v in videos if v.state == VideoState.failed]
    queue = blocks.read(clean, STUDIO, "production_queue")
    assert {f["video_id"] for f in queue["FAILED_RETRIES"]} == {v.id for v in failed}
    for v in failed:
        assert v.attempt_count == 2 and v.failure_reasons
    assert queue["BATCH_COMPLETE"] == 2  # the batch went on and finished


@pytest.mark.usefixtures("workers")
def test_wait_exits_non_zero_with_the_counts_when_a_video_failed(clean):
    assert run_cli("memory", "set", "quality_standards", "MIN_ACCEPTABLE_GRADE", "A").exit_code == 0
    assert run_cli("memory", "set", "quality_standards", "MAX_RETRIES", "1").exit_code == 0
    # palette adherence of an unnamed-colour prompt stays below A whatever the Writer adds
    result = run_cli("enqueue", "--wait", "Create 2 videos of an orange, red and green carnival")
    batch_id = int(result.output.split()[1].rstrip(":"))
    states = [v.state for v in videos_of(clean, batch_id)]
    accepted, failed = states.count(VideoState.accepted), states.count(VideoState.failed)
    assert failed >= 1 and result.exit_code == 1, result.output
    counts = f"{accepted} accepted, {failed} failed of 2 videos"
    assert result.output.strip().splitlines()[-1].endswith(f"batch {batch_id} done: {counts}"), result.output
    assert counts in run_cli("status", str(batch_id)).output


@pytest.mark.usefixtures("workers")
def test_content_series_continues_across_sessions(clean):
    first = submit("series", "Mythical Guardians", "--episodes", "2")
    wait_batch(clean, first)
    series = blocks.read(clean, STUDIO, "current_series")
    assert series["ACTIVE_SERIES"] == "Mythical Guardians" and series["EPISODES_PLANNED"] == 2
    assert series["SERIES_STYLE"] and series["CONSISTENCY_RULES"]
    accepted = sum(v.state == VideoState.accepted for v in videos_of(clean, first))
    assert series["EPISODES_COMPLETED"] == accepted
    for video in videos_of(clean, first):
        assert "series style: mythical guardians" in attempts_of(clean, video.id)[-1].prompt.lower()
    second = submit("series", "Mythical Guardians", "--episodes", "1")  # a later session
    wait_batch(clean, second)
    (episode3,) = videos_of(clean, second)
    assert "episode 3" in episode3.concept
    assert blocks.read(clean, STUDIO, "current_series")["EPISODES_PLANNED"] == 3


@pytest.mark.usefixtures("workers")
def test_ab_testing_with_preference_capture(clean):
    batch_id = submit("ab", "a fox in the snow", "--variations", "3")
    wait_batch(clean, batch_id)
    ab = blocks.read(clean, STUDIO, "ab_testing")
    test_id = int(ab["ACTIVE_TEST"])
    assert [v["label"] for v in ab["VARIATIONS"]] == ["A", "B", "C"]
    assert len({v["approach"] for v in ab["VARIATIONS"]}) == 3
    assert ab["VARIATION_A_ID"] and ab["VARIATION_B_ID"]
    bad = run_cli("pick", str(test_id), "Z")
    assert bad.exit_code != 0 and "no variation" in bad.output
    assert blocks.read(clean, STUDIO, "ab_testing") == ab  # nothing changed
    assert run_cli("pick", "9999", "A").exit_code != 0
    ok = run_cli("pick", str(test_id), "B")
    assert ok.exit_code == 0, ok.output
    ab = blocks.read(clean, STUDIO, "ab_testing")
    assert ab["USER_SELECTIONS"][-1]["label"] == "B" and ab["ACTIVE_TEST"] is None
    approach_b = next(v["approach"] for v in ab["VARIATIONS"] if v["label"] == "B")
    assert approach_b in ab["WINNING_PATTERNS"]
    with db.session_scope(clean) as s:
        sel = s.scalars(sa.select(ABSelection)).one()
        assert sel.chosen_label == "B" and len(sel.rejected_prompts) == 2
    closed = run_cli("pick", str(test_id), "A")
    assert closed.exit_code != 0 and "closed" in closed.output
    # the winning approach informs the next generation
    later = enqueue("Create a video of a heron")
    wait_batch(clean, later)
    (video,) = videos_of(clean, later)
    assert approach_b in attempts_of(clean, video.id)[0].prompt


@pytest.mark.usefixtures("workers")
def test_an_ab_test_belongs_to_its_user_and_says_what_the_studio_expected(clean):
    batch_id = submit("ab", "a heron at dawn", "--variations", "2", "--user", "alice")
    wait_batch(clean, batch_id)
    alice = Actor("alice")
    test_id = int(blocks.read(clean, alice, "ab_testing")["ACTIVE_TEST"])
    assert blocks.read(clean, STUDIO, "ab_testing")["ACTIVE_TEST"] is None  # the default user's block is untouched
    refused = run_cli("pick", str(test_id), "A", "--user", "bob")
    assert refused.exit_code == 2 and "made for alice" in refused.output
    ok = run_cli("pick", str(test_id), "A", "--user", "alice")
    assert ok.exit_code == 0, ok.output
    assert "the studio expected nothing" in ok.output  # alice has no taste yet: the studio default
    with db.session_scope(clean) as s:
        sel = s.scalars(sa.select(ABSelection)).one()
        assert sel.user_name == "alice" and sel.chosen_scores and len(sel.rejected_scores) == 1
        assert s.get(Batch, batch_id).user_name == "alice"
    assert blocks.read(clean, alice, "ab_testing")["USER_SELECTIONS"][-1]["label"] == "A"
    assert blocks.read(clean, STUDIO, "ab_testing")["USER_SELECTIONS"] == []


@pytest.mark.usefixtures("workers")
def test_cross_session_resume(clean):
    nothing = run_cli("resume", "--yes")
    assert nothing.exit_code == 0 and "nothing to resume" in nothing.output
    # a previous session stored a batch, but its messages died with that session's broker
    with db.session_scope(clean) as s:
        batch = Batch(request="Create 2 videos of glass castles", kind="batch", theme="glass castles", total=2)
        s.add(batch)
        s.flush()
        batch_id = batch.id
    blocks.update(
        clean, STUDIO, "session_state", {"PENDING_WORK": [{"batch_id": batch_id, "request": batch.request}]}, by="test"
    )
    result = run_cli("resume", "--yes")
    assert result.exit_code == 0 and f"batch {batch_id}" in result.output
    wait_batch(clean, batch_id)
    assert len(videos_of(clean, batch_id)) == 2
    assert blocks.read(clean, STUDIO, "session_state")["PENDING_WORK"] == []


@pytest.mark.usefixtures("workers")
def test_sleeptime_consolidation_every_n_interactions(clean):
    batch_id = enqueue("Create 5 videos of deep sea creatures")
    wait_batch(clean, batch_id)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        state = blocks.read(clean, STUDIO, "session_state")
        if state["LAST_SESSION_SUMMARY"]:
            break
        time.sleep(0.5)
    assert "5 videos finished" in state["LAST_SESSION_SUMMARY"]
    from mas.memory import recall

    # the sleeptime agent started from a clear buffer: only this run's messages are in context: the five
    # videos, what the crew's conversations answered meanwhile, and its summary
    read = recall.context(clean, "director_sleeptime").messages
    assert sum(m.content.startswith(("accepted:", "failed:")) for m in read) == 5
    assert all(m.content.startswith(("accepted:", "failed:")) or " answered: " in m.content for m in read[:-1])
    assert read[-1].role == "assistant" and "5 videos finished" in read[-1].content


@pytest.mark.parametrize(
    "args,message",
    [
        (["enqueue", ""], "empty"),
        (["enqueue", "please do something nice"], "can't tell"),
        (["enqueue", "Create 500 videos of cats"], "limit"),
        (["enqueue", "Create -2 videos of cats"], "at least 1"),
        (["enqueue", "x" * 5000], "characters"),
        (["style", "hmm"], "no colour"),
        (["pick", "12345", "A"], "no A/B test"),
        (["memory", "set", "user_style", "NOPE", "1"], "no field"),
        (["memory", "show", "nonsense"], "unknown memory block"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(clean, args, message):
    before = blocks.read_all(clean, STUDIO)
    result = run_cli(*args)
    assert result.exit_code != 0 and message in result.output
    assert len(result.output.strip().splitlines()) == 1
    with db.session_scope(clean) as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(Batch)) == 0
    assert blocks.read_all(clean, STUDIO) == before


@pytest.mark.usefixtures("workers")
def test_memory_commands_read_what_the_pipeline_wrote(clean):
    batch_id = enqueue("Create 2 videos of volcanic islands")
    wait_batch(clean, batch_id)
    found = run_cli("memory", "search", "lava and ocean", "--tag", "success")
    assert found.exit_code == 0 and "volcanic islands" in found.output
    stats = run_cli("memory", "stats")
    assert stats.exit_code == 0 and "quality" in stats.output and "archival passages:" in stats.output
    shown = run_cli("memory", "show", "production_queue")
    assert shown.exit_code == 0 and "BATCH_COMPLETE" in shown.output
    history = run_cli("memory", "history", "production_queue")
    assert history.exit_code == 0 and "director" in history.output
    status = run_cli("status", str(batch_id))
    assert status.exit_code == 0 and "2/2 done" in status.output
    assert "gpu queue: 0 high-priority tasks, 0 renders and 0 gradings waiting" in status.output
    listing = run_cli("videos", "--batch", str(batch_id))
    assert listing.exit_code == 0 and "accepted" in listing.output
