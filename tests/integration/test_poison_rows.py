"""No poison pill: every periodic job plants one row it cannot process among good ones, and the good ones are
processed; the bad one is marked with its error, tried again after its wait, then parked (`mas.pipeline.rows`),
and the listings show it as bad instead of failing on it.

The bad rows are planted directly in PostgreSQL, as the edge would now refuse them: a time Python cannot hold
(year 1 with +14:00 is 1 BC in UTC: "timestamp too small"), a number too long for Python to read, a buffer
whose messages cannot be read, a file that cannot be removed.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from click.testing import CliRunner

import gpu.tasks
import tasks.maintenance
import tasks.recovery
import tasks.sleeptime
from gpu.maintenance import CLEANUP_JOB, remove_partial_renders
from mas import names
from mas.cli import main
from mas.db import session_scope
from mas.domain.identity import Actor
from mas.domain.requests import ProductionRequest
from mas.memory import recall
from mas.models import (
    ABSelection,
    ABTest,
    Attempt,
    Batch,
    BatchStatus,
    IdempotencyKey,
    Schedule,
    StudioEvent,
    Video,
    VideoState,
    WebhookEvent,
)
from mas.outbox import eventlog
from mas.pipeline import production, rows
from mas.runtime.app import Studio
from tests.system.test_webhooks import Receiver, _add_events, _with_webhooks

YEAR_ONE = "0001-01-01T00:00:00+14:00"
"""Year 1 at +14:00: 1 BC in UTC, which PostgreSQL keeps and Python cannot read ("timestamp too small")."""


def _tries(settings, tries: int = 2):
    """Settings under which a failed row is tried again at once, and parked after `tries` failures."""
    return settings.changed(row_max_tries=tries, row_retry_seconds=0)


def _fault(settings, job: str, key: object) -> rows.Fault | None:
    return rows.faults(settings, job).get(str(key))


def _task(settings, name: str, *args):
    """Run a periodic job's task here, as a worker of `settings` would."""
    app = Studio(settings, set_as_current=False)
    app.loader.import_default_modules()
    return app.tasks[name].apply(args=args).get(timeout=120)


def _request(theme: str) -> ProductionRequest:
    return ProductionRequest(kind="batch", count=1, theme=theme, text=f"Create 1 videos of {theme}")


# --- schedules ------------------------------------------------------------------------------------------


def _schedule_at_year_one(settings) -> int:
    """Eve's schedule at year 1, planted in PostgreSQL as the edge would now refuse it: its id."""
    with session_scope(settings) as session:
        return session.execute(
            sa.text(
                "insert into schedules (run_at, request, spec, priority, user_name, status, options)"
                " values (cast(:at as timestamptz), 'Create 1 videos of ruins', cast(:spec as jsonb), 'normal',"
                " 'eve', 'scheduled', '{}') returning id"
            ),
            {"at": YEAR_ONE, "spec": json.dumps(_request("ruins").to_json())},
        ).scalar_one()


def test_a_schedule_at_year_one_is_marked_and_parked_and_every_other_users_schedule_runs(clean, held):
    settings = _tries(clean)
    due = datetime.now(UTC) - timedelta(minutes=5)
    good = {
        user: production.schedule(clean, Actor(user), _request(theme), run_at=due)
        for user, theme in (("ana", "herons"), ("ben", "kites"))
    }
    later = production.schedule(clean, Actor("ana"), _request("owls"), run_at=datetime.now(UTC) + timedelta(hours=6))
    bad = _schedule_at_year_one(clean)  # the earliest due schedule: the one the job used to stop on

    made = production.run_due_schedules(settings)
    assert len(made) == 2 and sorted(held) == sorted(made)
    with session_scope(clean) as session:
        sent = {s.user_name: s for s in session.scalars(sa.select(Schedule).where(Schedule.id.in_(good.values())))}
        assert {user: s.status for user, s in sent.items()} == {"ana": "sent", "ben": "sent"}
        assert session.get(Schedule, later).status == "scheduled"
    fault = _fault(clean, production.SCHEDULES_JOB, bad)
    assert fault is not None and (fault.attempts, fault.parked) == (1, False)
    assert "timestamp too small" in fault.error
    listed = CliRunner().invoke(main, ["schedule", "list"])
    assert listed.exit_code == 0 and listed.exception is None, listed.output
    assert "unreadable" in listed.output and "BC" in listed.output and "failing" in listed.output
    assert f"schedule {bad} failed (1 try" in listed.output and "timestamp too small" in listed.output

    assert production.run_due_schedules(settings) == []  # its second try: parked
    assert production.run_due_schedules(settings) == []  # parked: not tried again
    fault = _fault(clean, production.SCHEDULES_JOB, bad)
    assert fault is not None and (fault.attempts, fault.parked) == (2, True)
    listed = CliRunner().invoke(main, ["schedule", "list"])
    assert listed.exit_code == 0 and "parked" in listed.output, listed.output
    assert f"schedule {bad} parked after 2 tries: DataError: timestamp too small" in listed.output
    status = CliRunner().invoke(main, ["status"])  # every job's bad rows, under the batch shown
    assert status.exit_code == 0 and f"schedules {bad}: parked after 2 tries" in status.output, status.output
    later_row = production.schedule(clean, Actor("ben"), _request("moths"), run_at=datetime.now(UTC))
    assert production.run_due_schedules(settings) == [3] and later_row != bad  # still no one held up


def test_a_parked_schedule_once_mended_runs_after_mas_faults_retry_and_only_then(clean, held):
    """A parked row stays parked through the job's runs until a person mends it and says so; `mas faults
    list` names it, `mas faults retry JOB KEY` lets the next run take it, and a fault nobody has is an error."""
    settings = _tries(clean, tries=1)
    bad = _schedule_at_year_one(clean)
    assert production.run_due_schedules(settings) == []
    listed = CliRunner().invoke(main, ["faults", "list"])
    assert listed.exit_code == 0, listed.output
    assert f"schedules │ {bad}" in listed.output and "parked" in listed.output and "timestamp too small" in listed.output
    with session_scope(clean) as session:  # mended by hand: due now
        session.execute(sa.update(Schedule).where(Schedule.id == bad).values(run_at=datetime.now(UTC)))
    assert production.run_due_schedules(settings) == []  # parked: the mend alone changes nothing
    wrong = CliRunner().invoke(main, ["faults", "retry", "schedules", str(bad + 1000)])
    assert wrong.exit_code == 1 and "no fault of schedules" in wrong.output, wrong.output
    usage = CliRunner().invoke(main, ["faults", "retry"])
    assert usage.exit_code == 2 and "name a job" in usage.output, usage.output
    retried = CliRunner().invoke(main, ["faults", "retry", "schedules", str(bad)])
    assert retried.exit_code == 0 and f"schedules {bad}: tried again" in retried.output, retried.output
    made = production.run_due_schedules(settings)
    assert len(made) == 1 and made == held
    assert _fault(clean, production.SCHEDULES_JOB, bad) is None
    with session_scope(clean) as session:
        assert session.get(Schedule, bad).status == "sent"
    assert "no faults" in CliRunner().invoke(main, ["faults", "list"]).output


# --- webhook delivery -----------------------------------------------------------------------------------


def test_an_event_that_cannot_be_read_is_a_failed_try_and_every_other_batchs_events_are_delivered(clean):
    settings = _with_webhooks(clean, webhook_max_attempts=2)
    with Receiver() as receiver:
        first = _add_events(settings, url=receiver.url, batches=3, each=1)  # batch 1's first event goes bad
        [after_bad] = _add_events(settings, url=receiver.url, batches=1, each=1)  # batch 1's next: waits on it
        with session_scope(clean) as session:
            session.execute(
                sa.text(f"update webhook_events set payload = cast('{{\"n\": {'9' * 5000}}}' as jsonb) where id = :id"),
                {"id": first[0]},
            )
        assert _task(settings, names.DELIVER_WEBHOOKS) == {"delivered": 2, "retrying": 1, "failed": 0}
        assert sorted(d.id for d in receiver.accepted()) == sorted(first[1:])
        listed = CliRunner().invoke(main, ["webhooks"])
        assert listed.exit_code == 0 and listed.exception is None, listed.output
        assert f"{first[0]} video.accepted batch 1" in listed.output and "1 tries" in listed.output
        assert "last error: unreadable:" in listed.output

        with session_scope(clean) as session:  # its next try is due: its last, given up
            session.execute(sa.update(WebhookEvent).values(next_attempt_at=sa.func.now()))
        assert _task(settings, names.DELIVER_WEBHOOKS) == {"delivered": 1, "retrying": 0, "failed": 1}
        assert [d.id for d in receiver.accepted()][-1] == after_bad  # batch 1 goes on after it
        listed = CliRunner().invoke(main, ["webhooks"])
        assert listed.exit_code == 0 and "failed: 1" in listed.output and "given up" in listed.output, listed.output


# --- buffer maintenance ---------------------------------------------------------------------------------


def test_a_buffer_whose_messages_cannot_be_read_is_marked_and_every_other_buffer_is_maintained(clean):
    settings = _tries(clean.changed(buffer_warn=12))
    for agent in ("director", "writer", "cameraman"):
        for n in range(12):
            recall.append(settings, agent, role="user", content=f"{agent} message {n}")
    with session_scope(clean) as session:  # the writer's oldest message: a time Python cannot hold
        session.execute(
            sa.text(
                "update agent_messages set created_at = cast(:at as timestamptz)"
                " where id = (select min(id) from agent_messages where agent = 'writer')"
            ),
            {"at": YEAR_ONE},
        )
    actions = {action["agent"]: action for action in _task(settings, names.MAINTAIN_BUFFERS)}
    assert "writer" not in actions
    for agent in ("director", "cameraman"):
        assert (actions[agent]["action"], actions[agent]["count_after"]) == ("summarize", recall.KEEP_AFTER_SUMMARY)
    assert recall.count(settings, "writer") == 12
    fault = _fault(clean, tasks.maintenance.BUFFERS_JOB, "writer")
    assert fault is not None and "timestamp too small" in fault.error and not fault.parked
    _task(settings, names.MAINTAIN_BUFFERS)
    assert _fault(clean, tasks.maintenance.BUFFERS_JOB, "writer").parked


# --- sleeptime consolidation ----------------------------------------------------------------------------


def _finished_videos(settings, count: int) -> list[int]:
    """A done batch of `count` accepted videos, each with its prompt."""
    with session_scope(settings) as session:
        batch = Batch(request="earlier work", kind="batch", theme="herons", total=count, status=BatchStatus.done)
        session.add(batch)
        session.flush()
        ids = []
        for n in range(1, count + 1):
            video = Video(batch_id=batch.id, position=n, concept=f"heron {n}", state=VideoState.accepted, grade="A")
            session.add(video)
            session.flush()
            session.add(Attempt(video_id=video.id, number=1, prompt=f"a heron in mist, take {n}"))
            ids.append(video.id)
    return ids


def _unreadable_time(settings, table: str, column: str, row_id: int) -> None:
    with session_scope(settings) as session:
        session.execute(
            sa.text(f"update {table} set {column} = cast(:at as timestamptz) where id = :id"),
            {"at": YEAR_ONE, "id": row_id},
        )


def test_a_finished_video_that_cannot_be_read_is_left_out_of_the_consolidation_and_marked(clean):
    good, bad, other = _finished_videos(clean, 3)
    _unreadable_time(clean, "videos", "updated_at", bad)
    _task(clean, names.CONSOLIDATE)
    read = [m.content for m in recall.context(clean, "director_sleeptime").messages if m.role == "user"]
    assert any(line.startswith(f"accepted: video {good} grade A") for line in read), read
    assert any(line.startswith(f"accepted: video {other} grade A") for line in read), read
    assert not any(f"video {bad} " in line for line in read)
    fault = _fault(clean, tasks.sleeptime.CONSOLIDATION_JOB, bad)
    assert fault is not None and "timestamp too small" in fault.error


# --- reconcile ------------------------------------------------------------------------------------------


def test_a_lost_video_that_cannot_be_read_is_marked_and_every_other_lost_video_is_sent_again(clean):
    settings = _tries(clean)
    with session_scope(clean) as session:
        batch = Batch(request="lost work", kind="batch", theme="kites", total=3, status=BatchStatus.running)
        session.add(batch)
        session.flush()
        videos = [Video(batch_id=batch.id, position=n, concept=f"kite {n}") for n in range(3)]
        session.add_all(videos)
        session.flush()
        good, bad, other = (v.id for v in videos)
    _unreadable_time(clean, "videos", "updated_at", bad)
    report = tasks.recovery.reconcile(settings, older_than=0)
    assert sorted(report.resent) == [good, other]
    fault = _fault(clean, tasks.recovery.RESEND_JOB, bad)
    assert fault is not None and "timestamp too small" in fault.error and not fault.parked
    again = tasks.recovery.reconcile(settings, older_than=0)  # the others are queued now: not lost
    assert bad not in again.resent and _fault(clean, tasks.recovery.RESEND_JOB, bad).parked


# --- idempotency-key and event expiry -------------------------------------------------------------------


def test_expiry_deletes_old_keys_and_events_with_a_time_python_cannot_hold_among_them(clean):
    settings = clean.changed(idempotency_key_hours=1, event_retention_days=7)
    with session_scope(settings) as session:
        for key in ("ancient", "old", "young"):
            session.add(IdempotencyKey(user_name="ana", key=key, request_hash="h", batch_id=1))
        for kind in ("test.ancient", "test.old", "test.young"):
            eventlog.record(session, kind, batch_id=1, user_name="ana", data={})
    with session_scope(settings) as session:
        session.execute(
            sa.text("update idempotency_keys set created_at = now() - interval '2 hours' where key = 'old'")
        )
        session.execute(
            sa.text("update studio_events set created_at = now() - interval '8 days' where type = 'test.old'")
        )
        session.execute(
            sa.text("update idempotency_keys set created_at = cast(:at as timestamptz) where key = 'ancient'"),
            {"at": YEAR_ONE},
        )
        session.execute(
            sa.text("update studio_events set created_at = cast(:at as timestamptz) where type = 'test.ancient'"),
            {"at": YEAR_ONE},
        )
    assert _task(settings, names.EXPIRE_IDEMPOTENCY_KEYS) == 2
    assert _task(settings, names.EXPIRE_EVENTS) == 2
    with session_scope(settings) as session:
        assert list(session.scalars(sa.select(IdempotencyKey.key))) == ["young"]
        assert list(session.scalars(sa.select(StudioEvent.type))) == ["test.young"]


# --- nightly tuning -------------------------------------------------------------------------------------


def _picks(settings, user: str, rejected: object, count: int = 2) -> None:
    with session_scope(settings) as session:
        for n in range(count):
            test = ABTest(concept=f"a heron {n}", user_name=user)
            session.add(test)
            session.flush()
            session.add(
                ABSelection(test_id=test.id, chosen_label="A", chosen_prompt=f"a heron {n}, close-up",
                            rejected_prompts=rejected, concept=f"a heron {n}", user_name=user)
            )  # fmt: skip


def test_a_user_whose_picks_cannot_be_used_is_marked_and_every_other_user_is_tuned(clean):
    settings = _tries(clean)
    _picks(clean, "ana", ["a heron, wide shot"])
    _picks(clean, "eve", 5)  # a number where the rejected prompts' list belongs
    _picks(clean, "ben", ["a heron, handheld"])
    result = _task(settings, names.TUNE)
    assert sorted(report["user"] for report in result["reports"]) == ["ana", "ben"]
    assert all("2 preference pairs" in report["reason"] for report in result["reports"])
    assert list(result["failed"]) == ["eve"] and "TypeError" in result["failed"]["eve"]
    assert not _fault(clean, gpu.tasks.TUNING_JOB, "eve").parked
    _task(settings, names.TUNE)
    assert _fault(clean, gpu.tasks.TUNING_JOB, "eve").parked


# --- partial files --------------------------------------------------------------------------------------


def test_a_partial_file_that_cannot_be_removed_is_marked_and_every_other_is_removed(clean):
    settings = _tries(clean)
    folder = clean.videos_dir / "batch-1"
    folder.mkdir(parents=True, exist_ok=True)
    dead = [folder / f"video-{n}-attempt-1.{str(n) * 12}.partial.mp4" for n in (1, 2)]
    for path in dead:
        path.write_bytes(b"partial")
    stuck = folder / f"video-3-attempt-1.{'3' * 12}.partial.mp4"
    stuck.mkdir()  # a folder where a file was: it cannot be unlinked
    assert remove_partial_renders(settings) == 2 and not any(path.exists() for path in dead)
    fault = _fault(clean, CLEANUP_JOB, "batch-1/" + stuck.name)
    assert fault is not None and "IsADirectoryError" in fault.error and not fault.parked
    assert remove_partial_renders(settings) == 0
    assert _fault(clean, CLEANUP_JOB, "batch-1/" + stuck.name).parked
