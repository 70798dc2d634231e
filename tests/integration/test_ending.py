"""The one place a video ends (`mas.pipeline.ending`): the move, then each listener of the table, each tested
alone on real PostgreSQL rows; and no other module ends a video."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import sqlalchemy as sa

from mas import db, names
from mas.domain.identity import STUDIO
from mas.domain.states import BatchStatus, VideoState
from mas.memory import blocks
from mas.models import AgentBuffer, Batch, Series, Video, WebhookEvent
from mas.pipeline import ending

S = VideoState
SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()
ROOT = Path(__file__).resolve().parents[2]


def _videos(session, *, states=(S.reviewing, S.waiting), **fields) -> list[Video]:
    """A running batch with a video in each of `states`, in that order."""
    batch = Batch(request="r", theme="t", total=len(states), status=BatchStatus.running, **fields)
    session.add(batch)
    session.flush()
    videos = [
        Video(batch_id=batch.id, position=i, concept=f"c{i}", attempt_count=1, state=state)
        for i, state in enumerate(states)
    ]
    session.add_all(videos)
    session.flush()
    return videos


def _ended(settings, session, video: Video, *, was=S.reviewing, done=False) -> ending.Ended:
    return ending.Ended(settings, session, video, video.batch, was, batch_done=done)


def test_the_move_hands_the_change_to_every_listener_in_one_transaction(clean):
    settings = clean.model_copy(update={"webhook_url": "http://receiver.test/hook", "webhook_secret": SECRET})
    with db.session_scope(settings) as s:
        video_id = _videos(s, states=(S.reviewing,))[0].id
    with db.session_scope(settings) as s:
        ended = ending.end(settings, s, video_id, S.reviewing, S.accepted, attempt=1, grade="A")
        assert ended is not None
    with db.session_scope(settings) as s:
        assert s.get(Video, video_id).state == S.accepted
        assert s.scalar(sa.select(Batch.status)) == BatchStatus.done
        assert s.scalars(sa.select(WebhookEvent.type).order_by(WebhookEvent.seq)).all() == [
            "video.accepted",
            "batch.done",
        ]
    with db.session_scope(settings) as s:  # delivered again: the video has moved on, nothing is counted twice
        assert ending.end(settings, s, video_id, S.reviewing, S.accepted, attempt=1) is None
        assert s.scalar(sa.select(AgentBuffer.interactions)) == 1


def test_a_move_to_a_live_state_is_not_an_end(clean):
    with db.session_scope(clean) as s:
        video_id = _videos(s, states=(S.reviewing,))[0].id
        with pytest.raises(ValueError, match="not a final state"):
            ending.end(clean, s, video_id, S.reviewing, S.writing, attempt=1)


def test_give_up_fails_or_cancels_only_a_live_video(clean):
    with db.session_scope(clean) as s:
        first, second = (v.id for v in _videos(s))
    with db.session_scope(clean) as s:
        assert ending.give_up(clean, s, first, S.failed, "stuck", at=(S.grading, 1)) is None  # not at grading
        assert ending.give_up(clean, s, first, S.failed, "stuck", at=(S.reviewing, 1)) is not None
        assert ending.give_up(clean, s, first, S.cancelled, "late") is None  # already final
        assert ending.give_up(clean, s, second, S.cancelled, "cancelled by the user") is not None
    with db.session_scope(clean) as s:
        rows = s.execute(sa.select(Video.state, Video.failure_reasons).order_by(Video.position)).all()
        assert rows == [(S.failed, ["stuck"]), (S.cancelled, ["cancelled by the user"])]


def test_batch_completion_only_when_the_last_live_video_ends(clean):
    with db.session_scope(clean) as s:
        video = _videos(s)[0]
        ending.batch_completion(_ended(clean, s, video, done=False))
        assert video.batch.status == BatchStatus.running
        ending.batch_completion(_ended(clean, s, video, done=True))
        assert video.batch.status == BatchStatus.done


def test_the_production_queue_block_counts_the_video_and_lists_it(clean):
    with db.session_scope(clean) as s:
        video, waiting = _videos(s)
        blocks.update(
            clean, STUDIO,
            "production_queue",
            {"BATCH_ID": str(video.batch_id), "IN_PROGRESS": str(video.id)},
            by="director",
            session=s,
        )
        video.state, video.grade = S.accepted, "A"
        s.flush()
        ending.production_queue_block(_ended(clean, s, video))
    queue = blocks.read(clean, STUDIO, "production_queue")
    assert queue["IN_PROGRESS"] is None and queue["BATCH_COMPLETE"] == 1
    assert [e["video_id"] for e in queue["COMPLETED_TODAY"]] == [video.id]
    assert queue["PENDING_VIDEOS"] == [waiting.id]


def test_an_accepted_episode_counts_on_its_series(clean):
    with db.session_scope(clean) as s:
        series = Series(name="Guardians", theme="guardians", episodes_planned=2)
        s.add(series)
        s.flush()
        video = _videos(s, series_id=series.id)[0]
        video.state = S.failed
        ending.series_progress(_ended(clean, s, video))
        assert series.episodes_completed == 0
        video.state = S.accepted
        ending.series_progress(_ended(clean, s, video))
        assert series.episodes_completed == 1


def test_the_outbox_reports_a_cancelled_video_as_cancelled(clean):
    settings = clean.model_copy(update={"webhook_url": "http://receiver.test/hook", "webhook_secret": SECRET})
    with db.session_scope(settings) as s:
        video = _videos(s)[0]
        video.state, video.failure_reasons = S.cancelled, ["cancelled by the user"]
        s.flush()
        ending.outbox(_ended(settings, s, video))
        event = s.scalars(sa.select(WebhookEvent)).one()
        assert event.type == "video.cancelled" and event.payload["data"]["failure_reasons"] == ["cancelled by the user"]


def test_every_nth_end_sends_a_consolidation_after_the_commit(clean):
    settings = clean.model_copy(update={"sleeptime_frequency": 2})
    sent = []

    class App:
        def send_task(self, name, **_):
            sent.append(name)

    with db.session_scope(settings) as s:
        video = _videos(s)[0]
        actions = [ending.interactions(_ended(settings, s, video)) for _ in range(4)]
    assert [a is not None for a in actions] == [False, True, False, True]
    actions[1](App())
    assert sent == [names.CONSOLIDATE]


def test_a_video_that_leaves_a_place_ahead_of_the_gpus_lets_the_next_one_through(clean):
    settings = clean.model_copy(update={"write_ahead": 1})
    with db.session_scope(settings) as s:
        first, second = _videos(s, states=(S.rendering, S.waiting))
        first.state = S.failed
        s.flush()
        assert ending.pacing_release(_ended(settings, s, first, was=S.reviewing)) is None  # held no place
        assert ending.pacing_release(_ended(settings, s, first, was=S.rendering)) is not None
        s.refresh(second)
        assert second.state == S.writing


