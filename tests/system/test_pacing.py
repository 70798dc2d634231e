"""Writing only as far ahead as the GPUs need (`mas.pipeline.pacing`), on the real database and, end to end,
with the real workers: a batch larger than MAS_WRITE_AHEAD never has more videos written or being written and
not yet rendered; each finished render lets the next waiting video through; high-priority work is never held."""

from __future__ import annotations

import contextlib
import time

import pytest
import sqlalchemy as sa

from mas import db
from mas.domain.requests import ProductionRequest
from mas.models import Batch, BatchStatus, Video, VideoState
from mas.pipeline import control, pacing
from mas.pipeline.production import new_batch

S = VideoState


def _running_batch(settings, count: int, *, priority: str = "normal", user: str = "default") -> tuple[int, list[int]]:
    request = ProductionRequest(text=f"Create {count} videos of owls", kind="batch", count=count, theme="owls")
    with db.session_scope(settings) as session:
        batch = new_batch(session, request, priority=priority, user=user)
        batch.status = BatchStatus.running
        videos = [
            Video(batch_id=batch.id, position=i, concept=f"owl {i}", state=pacing.first_state(priority))
            for i in range(1, count + 1)
        ]
        session.add_all(videos)
        session.flush()
        return batch.id, [v.id for v in videos]


def _release(settings) -> list[int]:
    with db.session_scope(settings) as session:
        return [payload.video_id for payload, _ in pacing.release(settings, session)]


def _states(settings, ids: list[int]) -> list[VideoState]:
    with db.session_scope(settings) as session:
        by_id = dict(session.execute(sa.select(Video.id, Video.state).where(Video.id.in_(ids))).all())
    return [by_id[i] for i in ids]


def _move(settings, video_id: int, state: VideoState) -> None:
    with db.session_scope(settings) as session:
        session.execute(sa.update(Video).where(Video.id == video_id).values(state=state))


def test_a_waiting_video_is_let_through_each_time_a_place_ahead_of_the_gpus_frees(clean):
    settings = clean.model_copy(update={"write_ahead": 2})
    _, ids = _running_batch(settings, 5)
    assert _release(settings) == ids[:2]  # oldest first, no more than two ahead
    assert _states(settings, ids) == [S.writing, S.writing, S.waiting, S.waiting, S.waiting]
    assert _release(settings) == []
    _move(settings, ids[0], S.rendering)  # written: still ahead of the GPUs
    assert _release(settings) == []
    _move(settings, ids[0], S.grading)  # rendered: its place goes to the next one
    assert _release(settings) == [ids[2]]
    _move(settings, ids[1], S.failed)
    assert _release(settings) == [ids[3]]


def test_high_priority_work_is_never_held_and_holds_no_place(clean):
    settings = clean.model_copy(update={"write_ahead": 2})
    _, urgent = _running_batch(settings, 3, priority="high")
    assert _states(settings, urgent) == [S.writing] * 3  # started at once, by plan_batch
    _, normal = _running_batch(settings, 3)
    assert _release(settings) == normal[:2]


def test_a_paused_batch_waits_and_gives_its_places_to_others_and_a_cancel_ends_its_waiting_videos(clean):
    settings = clean.model_copy(update={"write_ahead": 2})
    first, ids = _running_batch(settings, 3)
    assert _release(settings) == ids[:2]
    second, others = _running_batch(settings, 3)
    assert _release(settings) == []
    control.pause_batch(settings, first)  # releases at once: the paused batch's places go to the other
    assert _states(settings, others) == [S.writing, S.writing, S.waiting]
    assert _states(settings, ids) == [S.writing, S.writing, S.waiting]  # its own waiting video stays
    control.cancel_batch(settings, second)
    assert _states(settings, others) == [S.cancelled] * 3
    with db.session_scope(settings) as session:
        assert session.get(Batch, second).status == BatchStatus.cancelled


def _render_one(settings, released: list[int]) -> list[int]:
    """The oldest released video's render ends; the videos let through in its place."""
    _move(settings, released.pop(0), S.grading)
    let_through = _release(settings)
    released.extend(let_through)
    return let_through


def test_a_users_waiting_video_goes_next_whatever_another_user_has_queued(clean):
    settings = clean.model_copy(update={"write_ahead": 2})
    _, many = _running_batch(settings, 40, user="ana")
    released = _release(settings)
    assert released == many[:2]
    for _ in range(10):
        _render_one(settings, released)
    _, (single,) = _running_batch(settings, 1, user="ben")
    assert _render_one(settings, released) == [single]  # the next place is ben's, not ana's 13th


def test_users_who_both_wait_share_the_places_by_their_shares(clean):
    from mas.models import User

    settings = clean.model_copy(update={"write_ahead": 1})
    with db.session_scope(settings) as session:
        session.add_all([User(name="ana", role="member", gpu_share=3.0), User(name="ben", role="member")])
    _, ana = _running_batch(settings, 60, user="ana")
    _, ben = _running_batch(settings, 60, user="ben")
    released = _release(settings)
    given = list(released)
    for _ in range(39):
        given += _render_one(settings, released)
    assert (sum(v in ana for v in given), sum(v in ben for v in given)) == (30, 10)
    assert [v for v in given if v in ana] == ana[:30]  # each user's own videos in their order


@pytest.mark.usefixtures("workers")
def test_a_batch_larger_than_the_write_ahead_never_runs_ahead_of_the_gpus(clean):
    """The session's workers run with the default MAS_WRITE_AHEAD; a trigger in the database counts the
    videos written or being written and not yet rendered after every change of a video, as it happens.
    A refinement (a later attempt) is never held back: it counts, so no new video is let through while it is
    ahead, but it may itself take the count past the limit; first attempts never do."""
    from tests.system.test_use_cases import enqueue, videos_of, wait_batch

    engine = db.ready_engine(clean)
    with engine.begin() as conn:
        conn.execute(sa.text("create table ahead_seen (n int)"))
        conn.execute(sa.text("""
            create function count_ahead() returns trigger language plpgsql as $$
            begin
                insert into ahead_seen select count(*) from videos
                    where state in ('writing', 'rendering') and attempt_count = 1;
                return null;
            end $$"""))
        conn.execute(sa.text(
            "create trigger count_ahead after insert or update on videos for each statement execute function count_ahead()"
        ))
    try:
        count = clean.scheduling.write_ahead + 4
        batch_id = enqueue(f"Create {count} videos of mythical creatures")
        wait_batch(clean, batch_id, timeout=300)
        with engine.connect() as conn:
            seen = conn.scalars(sa.text("select n from ahead_seen")).all()
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text("drop trigger if exists count_ahead on videos"))
            conn.execute(sa.text("drop function if exists count_ahead()"))
            conn.execute(sa.text("drop table if exists ahead_seen"))
    assert max(seen) == clean.scheduling.write_ahead  # full, and never more new videos
    assert len(videos_of(clean, batch_id)) == count
    assert all(v.state in (S.accepted, S.failed) for v in videos_of(clean, batch_id))


def test_a_write_that_fails_for_good_lets_the_next_waiting_video_through_at_once(clean):
    """The failure handler frees the failed video's place and sends the next one's chain (no wait for a
    reconcile)."""
    from types import SimpleNamespace

    from mas.domain.steps import BY_NAME
    from mas.pipeline import leases
    from mas.pipeline.outcomes import fail_on_error
    from mas.runtime.app import Studio
    from tasks.recovery import live_work

    settings = clean.model_copy(update={"write_ahead": 1})
    batch_id, ids = _running_batch(settings, 2)
    assert _release(settings) == ids[:1]
    app = Studio(settings, set_as_current=False)
    task = SimpleNamespace(app=app, step=BY_NAME["write"], name="tasks.pipeline.write_prompt")
    fail_on_error(task, RuntimeError("the model never answered validly"), "id", [{"video_id": ids[0], "attempt": 1}], {}, None)
    first, second = _states(settings, ids)
    assert first == S.failed and second != S.waiting

    def carried() -> bool:  # its write was sent: queued, held by a worker of the session, running, or done
        return _states(settings, ids)[1] != S.writing or ids[1] in live_work(settings).videos | leases.running(settings)

    deadline = time.monotonic() + 30  # a worker may be between taking the message and claiming the step
    while not carried():
        assert time.monotonic() < deadline, "the next video's write was not sent"
        time.sleep(0.2)

    # leave the session's workers nothing of this batch: the next test empties the tables under them
    with contextlib.suppress(control.NotChangeable):  # the session's workers may have carried it to its end
        control.cancel_batch(settings, batch_id)

    def left() -> set[int]:
        return set(ids) & (live_work(settings).videos | leases.running(settings))

    deadline = time.monotonic() + 60
    while left():
        assert time.monotonic() < deadline, f"videos {left()} still running after their batch was cancelled"
        time.sleep(0.2)
