"""The typed production request: built from its parts by `mas series` / `mas ab`, stored as JSON by batches
and schedules, read back without parsing English; and `--at` refusing a time it cannot use."""

from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from mas import db
from mas.cli import main
from mas.domain.identity import Actor
from mas.domain.requests import ProductionRequest
from mas.models import Batch, Schedule
from mas.pipeline.production import request_of, run_due_schedules, schedule


def run_cli(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def batches(settings) -> list[Batch]:
    with db.session_scope(settings) as s:
        return list(s.scalars(sa.select(Batch).order_by(Batch.id)))


def test_a_series_name_is_taken_whole(clean):
    result = run_cli("series", "A Series of Unfortunate Foxes", "--episodes", "2")
    assert result.exit_code == 0, result.output
    [batch] = batches(clean)
    request = request_of(batch)
    assert (request.kind, request.count, request.series_name) == ("series", 2, "A Series of Unfortunate Foxes")
    assert batch.spec == request.to_json() and batch.theme == "A Series of Unfortunate Foxes"
    assert batch.priority == "normal" and "priority" not in batch.options


def test_an_ab_concept_is_taken_whole_and_runs_at_the_ab_priority(clean):
    result = run_cli("ab", "a fox: 3 variations of a 2-part series", "--variations", "4")
    assert result.exit_code == 0, result.output
    [batch] = batches(clean)
    assert request_of(batch) == ProductionRequest(
        kind="ab", count=4, theme="a fox: 3 variations of a 2-part series", text=batch.request,
    )
    assert batch.priority == clean.ab.priority


def test_a_schedule_keeps_its_request_priority_and_user(clean):
    alice = Actor("alice")
    request = ProductionRequest.series("A Series of Unfortunate Foxes", episodes=2, settings=clean)
    due = schedule(clean, alice, request, run_at=datetime.now(UTC) - timedelta(seconds=2), priority="high")
    with db.session_scope(clean) as s:  # and one stored before requests were typed: read from its text
        s.add(Schedule(run_at=datetime.now(UTC) - timedelta(seconds=1), request="Create 2 videos of owls"))
    assert run_due_schedules(clean) == [1, 2]
    first, second = batches(clean)
    assert request_of(first) == request and (first.priority, first.user_name) == ("high", "alice")
    assert (request_of(second).kind, request_of(second).theme, second.priority) == ("batch", "owls", "normal")
    with db.session_scope(clean) as s:
        assert s.get(Schedule, due).status == "sent"


def test_a_batch_written_without_a_spec_is_read_from_its_columns(clean):
    with db.session_scope(clean) as s:
        s.add(Batch(request="r", kind="series", theme="the fox", total=2, options={"series_name": "Fox Tales"}))
    [batch] = batches(clean)
    assert request_of(batch) == ProductionRequest(kind="series", count=2, theme="the fox", series_name="Fox Tales",
                                                  text="r")


def test_migration_0005_moves_priority_user_and_request_out_of_options(clean, engine):
    db.downgrade(engine, "0004")
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(
                "insert into batches (request, kind, theme, total, status, options) values "
                "('Create a 2-part Fox Tales series', 'series', 'Fox Tales', 2, 'queued', "
                """'{"series_name": "Fox Tales", "priority": "high"}'), """
                "('Create 3 videos of owls', 'batch', 'owls', 3, 'queued', '{}')"
            ))
            conn.execute(sa.text(
                "insert into schedules (run_at, request, options, status) values "
                """(now(), 'Create 2 videos of owls', '{"priority": "high", "user": "alice"}', 'scheduled')"""
            ))
    finally:
        db.migrate(engine)
    series, owls = batches(clean)
    assert request_of(series) == ProductionRequest(
        kind="series", count=2, theme="Fox Tales", series_name="Fox Tales", text="Create a 2-part Fox Tales series",
    )
    assert series.priority == "high" and owls.priority == "normal" and request_of(owls).theme == "owls"
    with db.session_scope(clean) as s:
        row = s.get(Schedule, 1)
        assert (row.spec, row.priority, row.user_name) == (None, "high", "alice")


@pytest.mark.parametrize("at", ["99999999999999999999:00", "24:00", "12:60", "-1:30", "noon", "12:30:00"])
def test_a_time_that_cannot_be_used_is_refused_in_one_line_and_changes_nothing(clean, at):
    result = run_cli("enqueue", "--at", at, "Create 2 videos of cats")
    assert result.exit_code == 2 and "HH:MM" in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1
    with db.session_scope(clean) as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(Batch)) == 0
        assert s.scalar(sa.select(sa.func.count()).select_from(Schedule)) == 0
