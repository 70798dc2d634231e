"""The one place a batch starts (`mas.pipeline.starting`): its plan stored as videos, and each listener of the
table, on real PostgreSQL rows, in the caller's transaction."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from mas import db
from mas.domain.identity import Actor
from mas.domain.plans import Plan, PlannedVideo
from mas.domain.requests import ProductionRequest
from mas.domain.states import BatchStatus, VideoState
from mas.memory import blocks
from mas.models import ABTest, ABVariation, Batch, Series, StudioEvent, Video
from mas.pipeline import starting


def _queued(session, request: ProductionRequest, *, user: str = "ana", priority: str = "normal") -> Batch:
    batch = Batch(request=request.text, theme=request.theme, total=request.count, kind=request.kind,
                  status=BatchStatus.queued, user_name=user, priority=priority)  # fmt: skip
    session.add(batch)
    session.flush()
    return batch


def _request(kind: str = "batch", count: int = 2, **fields) -> ProductionRequest:
    return ProductionRequest(kind=kind, count=count, theme="lanterns", text=f"{count} videos of lanterns", **fields)


def _plan(count: int, **fields) -> Plan:
    return Plan(videos=[PlannedVideo(concept=f"lantern {i}", **fields) for i in range(1, count + 1)])


def test_the_start_stores_the_videos_and_hands_the_change_to_every_listener_in_one_transaction(clean):
    request = _request(kind="series", series_name="Lantern Keepers")
    with db.session_scope(clean) as s:
        batch_id = _queued(s, request).id
    with db.session_scope(clean) as s:
        batch = s.get_one(Batch, batch_id)
        started = starting.start(clean, s, batch, request, _plan(2), style={"liked": ["gold"]})
        assert len(started.after_commit) == 1  # the first videos, sent once the transaction is over
    with db.session_scope(clean) as s:
        batch = s.get_one(Batch, batch_id)
        assert batch.status == BatchStatus.running and batch.style == {"liked": ["gold"]}
        videos = s.scalars(sa.select(Video).where(Video.batch_id == batch_id).order_by(Video.position)).all()
        assert [v.concept for v in videos] == ["lantern 1", "lantern 2"] and [v.id for v in videos] == started.video_ids
        series = s.scalars(sa.select(Series)).one()
        assert (series.name, series.episodes_planned, batch.series_id) == ("Lantern Keepers", 2, series.id)
        planned = s.scalars(sa.select(StudioEvent).where(StudioEvent.type == "batch.planned")).one()
        assert planned.payload["videos"] == started.video_ids and planned.payload["style"] == {"liked": ["gold"]}
    ana = Actor("ana")
    assert blocks.read(clean, ana, "production_queue")["PENDING_VIDEOS"] == started.video_ids
    assert blocks.read(clean, ana, "current_series")["ACTIVE_SERIES"] == "Lantern Keepers"
    assert blocks.read(clean, ana, "session_state")["QUEUED_VIDEOS"] == started.video_ids


def test_a_start_whose_transaction_fails_leaves_nothing(clean):
    request = _request(kind="series", series_name="Lantern Keepers")
    with db.session_scope(clean) as s:
        batch_id = _queued(s, request).id
    with pytest.raises(RuntimeError), db.session_scope(clean) as s:
        starting.start(clean, s, s.get_one(Batch, batch_id), request, _plan(2), style={})
        raise RuntimeError("the transaction fails after the start")
    with db.session_scope(clean) as s:
        assert s.get_one(Batch, batch_id).status == BatchStatus.queued
        assert s.scalar(sa.select(sa.func.count()).select_from(Video)) == 0
        assert s.scalar(sa.select(sa.func.count()).select_from(Series)) == 0
        assert (
            s.scalar(sa.select(sa.func.count()).select_from(StudioEvent).where(StudioEvent.type == "batch.planned"))
            == 0
        )


def test_an_ab_start_makes_the_test_and_its_variations(clean):
    request = _request(kind="ab", count=2)
    plan = Plan(videos=[PlannedVideo(concept="heron", label="A", approach="wide"),
                        PlannedVideo(concept="heron", label="B", approach="close")])  # fmt: skip
    with db.session_scope(clean) as s:
        batch = _queued(s, request)
        started = starting.start(clean, s, batch, request, plan, style={})
    with db.session_scope(clean) as s:
        test = s.scalars(sa.select(ABTest)).one()
        assert s.get_one(Batch, batch.id).ab_test_id == test.id
        variations = s.scalars(sa.select(ABVariation).order_by(ABVariation.label)).all()
        assert [(v.label, v.approach, v.video_id) for v in variations] == [
            ("A", "wide", started.video_ids[0]),
            ("B", "close", started.video_ids[1]),
        ]
    assert blocks.read(clean, Actor("ana"), "ab_testing")["ACTIVE_TEST"] == str(test.id)


def test_an_urgent_batch_starts_every_video_at_once_after_the_commit(clean, monkeypatch):
    sent: list = []
    monkeypatch.setattr(starting, "send_released", lambda _app, released: sent.extend(released))  # the broker's part
    request = _request(count=3)
    with db.session_scope(clean) as s:
        batch = _queued(s, request, priority="high")
        started = starting.start(clean, s, batch, request, _plan(3), style={})
        assert sent == []  # nothing is sent inside the transaction
    with db.session_scope(clean) as s:
        assert s.scalars(sa.select(Video.state).where(Video.batch_id == batch.id)).all() == [VideoState.writing] * 3
    started.run(app=None)  # type: ignore[arg-type]
    assert sorted(payload.video_id for payload, _ in sent) == started.video_ids
    assert {priority for _, priority in sent} == {"high"}
