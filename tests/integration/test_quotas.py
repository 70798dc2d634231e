"""Quotas per user and where waiting work stands, against real PostgreSQL and Redis.

Fifty submits at once pass exactly a quota's room and the rest are refused whole (429 with Retry-After from the
API, nothing half-written); each kind of quota counts what it says; a user's own quota overrides the studio's
default; the CLI refuses in one line; a schedule its quotas refuse ends failed with the reason; `mas users set`
and `list`; a batch queued behind another says how many renders are ahead of each of its videos and when each
may start, from measured render times.

No worker plans these batches: the submit path is real up to the broker, and the message to the Director is
recorded instead of sent (`held`), so the session's workers, running for other modules, leave them queued.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from starlette.testclient import TestClient

from mas.accounts import users
from mas.cli import main
from mas.db import session_scope
from mas.domain.identity import STUDIO, Actor
from mas.domain.requests import ProductionRequest
from mas.gallery import create_app
from mas.models import Attempt, Batch, BatchStatus, IdempotencyKey, Schedule, Video, VideoState
from mas.pipeline import pacing, production, quotas

SUBMITTERS = 50
SECRET = "whsec_" + "c2VjcmV0LWJ5dGVzLWZvci10aGUtdGVzdHMtb2YtcXVvdGFz"  # base64 of 36 bytes


def _user(settings, name: str, **limits) -> dict[str, str]:
    key = users.add(settings, name)
    if limits:
        users.set_limits(settings, name, limits)
    return {"Authorization": f"Bearer {key}"}


def _counts(settings) -> dict[str, int]:
    with session_scope(settings) as session:
        count = lambda table: session.scalar(sa.select(sa.func.count()).select_from(table))  # noqa: E731
        return {
            "batches": count(Batch),
            "videos asked": session.scalar(sa.select(sa.func.coalesce(sa.func.sum(Batch.total), 0))),
            "videos": count(Video),
            "keys": count(IdempotencyKey),
            "keys without a batch": session.scalar(
                sa.select(sa.func.count()).select_from(IdempotencyKey).where(IdempotencyKey.batch_id.is_(None))
            ),
        }


def _all_at_once(work, count: int = SUBMITTERS) -> list:
    """`work(i)` in `count` threads released together."""
    start = threading.Barrier(count)

    def run(i: int):
        start.wait()
        return work(i)

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(run, range(count)))


def _request(count: int, theme: str = "owls") -> ProductionRequest:
    return ProductionRequest(kind="batch", count=count, theme=theme, text=f"Create {count} videos of {theme}")


# --- fifty at once ------------------------------------------------------------------------------------


def test_fifty_api_submits_at_once_pass_exactly_the_daily_quota_and_the_rest_are_refused_whole(clean, held):
    alice = _user(clean, "alice", videos_per_day=10)
    app = create_app(clean)

    def submit(i: int):
        http = TestClient(app, raise_server_exceptions=False)
        return http.post(
            "/api/v1/batches", json={"theme": "owls", "count": 1}, headers={**alice, "Idempotency-Key": f"owl-{i}"}
        )

    replies = _all_at_once(submit)
    passed = [r for r in replies if r.status_code == 201]
    refused = [r for r in replies if r.status_code != 201]
    assert len(passed) == 10 and len(refused) == SUBMITTERS - 10, sorted({r.status_code for r in replies})
    for reply in refused:
        body = reply.json()
        assert reply.status_code == 429 and body["retryable"] is True and body["type"] == "urn:mas:problem:quota"
        wait = int(reply.headers["Retry-After"])
        assert 0 < wait <= 24 * 3600 and body["retry_after"] == wait
        assert "alice's quota is full: 10 videos in the last 24 h and 1 more pass the 10 a day" in body["detail"]
    assert _counts(clean) == {"batches": 10, "videos asked": 10, "videos": 0, "keys": 10, "keys without a batch": 0}
    with session_scope(clean) as session:
        made = set(session.scalars(sa.select(Batch.id).where(Batch.user_name == "alice")))
        keyed = set(session.scalars(sa.select(IdempotencyKey.batch_id)))
    assert made == keyed == {r.json()["batch_id"] for r in passed} == set(held)


def test_fifty_submits_at_once_pass_exactly_the_batches_at_once_and_the_videos_waiting(clean, held):
    bob = clean.changed(quota_batches_at_once=4), Actor("bob")  # the studio's defaults, no user row

    def submit(settings, actor):
        def one(i: int):  # noqa: ARG001
            try:
                return production.submit(settings, actor, _request(2))
            except quotas.QuotaExceeded as exc:
                return exc

        return one

    outcomes = _all_at_once(submit(*bob))
    assert sum(isinstance(o, int) for o in outcomes) == 4
    assert {o.retry_after for o in outcomes if not isinstance(o, int)} == {quotas.WAIT_HINT_SECONDS}
    assert _counts(clean)["batches"] == 4

    carol = clean.changed(quota_videos_waiting=7), Actor("carol")
    outcomes = _all_at_once(submit(*carol))
    assert sum(isinstance(o, int) for o in outcomes) == 3  # 3 x 2 videos of 7
    refused = [o for o in outcomes if not isinstance(o, int)]
    assert len(refused) == SUBMITTERS - 3 and "6 videos waiting and 2 more pass the 7 allowed" in str(refused[0])
    assert _counts(clean) == {"batches": 7, "videos asked": 14, "videos": 0, "keys": 0, "keys without a batch": 0}
    assert len(held) == 7


# --- each kind counts what it says --------------------------------------------------------------------


def _plan_by_hand(settings, batch_id: int, states: list[VideoState]) -> list[int]:
    """What planning writes (Video rows, the batch running), the videos in `states` (as the steps would leave them)."""
    with session_scope(settings) as session:
        batch = session.get(Batch, batch_id)
        batch.status = BatchStatus.running
        rows = [
            Video(batch_id=batch_id, position=n, concept=f"{batch.theme} {n}", state=state)
            for n, state in enumerate(states, start=1)
        ]
        session.add_all(rows)
        session.flush()
        return [v.id for v in rows]


def test_videos_waiting_counts_unplanned_batches_whole_and_planned_ones_by_their_unfinished_videos(clean, held):
    dana = clean.changed(quota_videos_waiting=5), Actor("dana")
    first = production.submit(*dana, _request(3))  # queued, not planned: its 3 count
    with pytest.raises(quotas.QuotaExceeded, match="3 videos waiting and 3 more pass the 5 allowed"):
        production.submit(*dana, _request(3))
    S = VideoState
    _plan_by_hand(clean, first, [S.accepted, S.failed, S.rendering])  # one not yet ended
    second = production.submit(*dana, _request(3))
    with pytest.raises(quotas.QuotaExceeded, match="4 videos waiting and 2 more"):
        production.submit(*dana, _request(2))
    with pytest.raises(quotas.LargerThanQuota, match="asks for 6 videos and dana's quota allows 5 waiting"):
        production.submit(*dana, _request(6))
    production.submit(clean.changed(quota_videos_waiting=5), Actor("erin"), _request(5))  # another's room
    with session_scope(clean) as session:  # an ended batch's videos count no more, whatever their state
        session.execute(sa.update(Batch).where(Batch.id == second).values(status=BatchStatus.cancelled))
    assert production.submit(*dana, _request(4))
    assert len(held) == 4


def test_batches_at_once_counts_batches_not_yet_ended(clean, held):
    frank = clean.changed(quota_batches_at_once=2), Actor("frank")
    first, _ = production.submit(*frank, _request(1)), production.submit(*frank, _request(1))
    with pytest.raises(quotas.QuotaExceeded, match="2 batches not yet ended, of 2 at once") as refused:
        production.submit(*frank, _request(1))
    assert refused.value.retry_after == quotas.WAIT_HINT_SECONDS and refused.value.retryable
    with session_scope(clean) as session:
        session.execute(sa.update(Batch).where(Batch.id == first).values(status=BatchStatus.paused))
    with pytest.raises(quotas.QuotaExceeded):
        production.submit(*frank, _request(1))  # paused is not ended
    with session_scope(clean) as session:
        session.execute(sa.update(Batch).where(Batch.id == first).values(status=BatchStatus.done))
    production.submit(*frank, _request(1))
    with pytest.raises(quotas.LargerThanQuota, match="allows no batch at all"):
        production.submit(clean.changed(quota_batches_at_once=0), Actor("gina"), _request(1))
    assert len(held) == 3


def _age(settings, batch_id: int, by: timedelta) -> None:
    with session_scope(settings) as session:
        session.execute(sa.update(Batch).where(Batch.id == batch_id).values(created_at=Batch.created_at - by))


def test_the_daily_quota_says_when_the_oldest_counted_videos_leave_the_window(clean, held):
    hana = _user(clean, "hana", videos_per_day=5)
    http = TestClient(create_app(clean), raise_server_exceptions=False)
    submit = lambda count: http.post("/api/v1/batches", json={"theme": "kites", "count": count}, headers=hana)  # noqa: E731
    older = submit(2).json()["batch_id"]
    _age(clean, older, timedelta(hours=23))  # leaves the window in an hour
    newer = submit(3).json()["batch_id"]
    _age(clean, newer, timedelta(hours=1))  # in 23 hours
    one = submit(1)
    assert one.status_code == 429, one.text
    assert 3500 < int(one.headers["Retry-After"]) <= 3600  # when the older batch's 2 videos leave
    three = submit(3)  # needs the newer batch's videos gone too
    assert three.status_code == 429 and 23 * 3600 - 100 < int(three.headers["Retry-After"]) <= 23 * 3600
    assert "nothing was queued; try again in 60 min" in one.json()["detail"]
    too_many = submit(6)
    assert too_many.status_code == 422 and too_many.json()["retryable"] is False and "Retry-After" not in too_many.headers
    _age(clean, older, timedelta(hours=1, seconds=1))  # out of the window now
    assert submit(2).status_code == 201
    assert _counts(clean)["batches"] == 3 and len(held) == 3


def test_a_users_own_quota_overrides_the_studios_default(clean, held):
    settings = clean.changed(quota_videos_per_day=2)
    own = _user(settings, "ines", videos_per_day=5)
    default = _user(settings, "jon")
    http = TestClient(create_app(settings), raise_server_exceptions=False)
    batch = lambda who, count: http.post("/api/v1/batches", json={"theme": "foxes", "count": count}, headers=who)  # noqa: E731
    assert batch(own, 5).status_code == 201
    assert batch(default, 3).status_code == 422  # the default: more than it allows in one request
    assert batch(default, 2).status_code == 201
    assert batch(default, 1).status_code == 429
    users.set_limits(settings, "ines", {"videos_per_day": None})  # back to the default, 5 already today
    assert batch(own, 1).status_code == 429
    users.set_limits(settings, "jon", {"videos_per_day": 0})
    assert batch(default, 1).json()["detail"].startswith("the request asks for 1 videos and jon's quota allows 0")
    assert len(held) == 2


# --- the command line ----------------------------------------------------------------------------------


def test_the_cli_refuses_a_submit_beyond_a_quota_in_one_line(clean, held):
    cli = CliRunner()
    env = {"MAS_QUOTA_VIDEOS_PER_DAY": "4"}
    ok = cli.invoke(main, ["enqueue", "Create 3 videos of owls"], env=env)
    assert ok.exit_code == 0, ok.output
    full = cli.invoke(main, ["series", "Night Owls", "--episodes", "2"], env=env)
    lines = full.output.strip().splitlines()
    assert full.exit_code == 1 and len(lines) == 1, full.output
    assert "default's quota is full: 3 videos in the last 24 h and 2 more pass the 4 a day" in lines[0]
    assert "nothing was queued; try again in" in lines[0]
    never = cli.invoke(main, ["ab", "a heron at dawn", "--variations", "5"], env=env)
    assert never.exit_code == 2 and len(never.output.strip().splitlines()) == 1, never.output
    assert "asks for 5 videos and default's quota allows 4 a day" in never.output
    assert _counts(clean)["batches"] == 1 and len(held) == 1


def test_users_set_changes_share_quotas_and_secret_and_list_shows_them(clean):
    cli = CliRunner()
    assert cli.invoke(main, ["users", "add", "kim"]).exit_code == 0
    assert cli.invoke(main, ["users", "add", "lee"]).exit_code == 0
    done = cli.invoke(
        main,
        ["users", "set", "kim", "--share", "2.5", "--videos-per-day", "30", "--batches-at-once", "0",
         "--webhook-secret", SECRET],
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    assert "kim: gpu share 2.5; videos a day 30, videos waiting no limit, batches at once 0" in done.output
    assert SECRET not in done.output
    with session_scope(clean) as session:
        from mas.models import User

        kim = session.get(User, "kim")
        assert (kim.gpu_share, kim.videos_per_day, kim.videos_waiting, kim.batches_at_once, kim.webhook_secret) == (
            2.5, 30, None, 0, SECRET,
        )  # fmt: skip
    listed = cli.invoke(main, ["users", "list"], env={"MAS_QUOTA_VIDEOS_WAITING": "12"})
    assert listed.exit_code == 0, listed.output
    rows = {line.split("│")[1].strip(): [cell.strip() for cell in line.split("│")[2:-1]]
            for line in listed.output.splitlines() if "│" in line and ("(default)" in line or "no limit" in line)}  # fmt: skip
    assert rows["kim"] == ["2.5", "30", "12 (default)", "0", "own"], listed.output
    assert rows["lee"] == ["1", "no limit", "12 (default)", "no limit", "studio's"], listed.output
    back = cli.invoke(main, ["users", "set", "kim", "--no-limit-videos-per-day", "--no-webhook-secret"])
    assert back.exit_code == 0 and "videos a day no limit" in back.output and "webhook secret the studio's" in back.output

    refused = {
        ("--share", "0"): "a GPU share is a number above 0",
        ("--share", "nan"): "a GPU share is a number above 0",
        ("--share", "inf"): "a GPU share is a number above 0",
        ("--share", "-1"): "a GPU share is a number above 0",
        ("--webhook-secret", "whsec_tooshort"): "a user's webhook secret must be whsec_",
        ("--videos-per-day", "3", "--no-limit-videos-per-day"): "not both",
        (): "nothing to change",
    }
    with session_scope(clean) as session:
        before = session.execute(sa.text("select * from users order by name")).all()
    for args, message in refused.items():
        result = cli.invoke(main, ["users", "set", "lee", *args])
        assert result.exit_code == 2 and message in result.output, (args, result.output)
        assert "tooshort" not in result.output
    negative = cli.invoke(main, ["users", "set", "lee", "--batches-at-once", "-1"])
    assert negative.exit_code == 2 and "-1" in negative.output
    nobody = cli.invoke(main, ["users", "set", "nobody", "--share", "2"])
    assert nobody.exit_code == 2 and "there is no user 'nobody'" in nobody.output
    with session_scope(clean) as session:
        assert session.execute(sa.text("select * from users order by name")).all() == before


# --- schedules are counted when they run ----------------------------------------------------------------


def test_a_schedule_its_quotas_refuse_when_it_runs_ends_failed_with_the_reason(clean, held):
    mia = clean.changed(quota_batches_at_once=1), Actor("mia")
    production.submit(*mia, _request(1))
    due = datetime.now(UTC) - timedelta(seconds=5)
    refused = production.schedule(*mia, _request(2, "moths"), run_at=due)
    passes = production.schedule(clean, Actor("ned"), _request(2, "moths"), run_at=due)
    made = production.run_due_schedules(mia[0])
    assert len(made) == 1 and production.run_due_schedules(mia[0]) == []  # refused once, not tried again
    with session_scope(clean) as session:
        failed, sent = session.get(Schedule, refused), session.get(Schedule, passes)
        assert (failed.status, failed.batch_id, sent.status, sent.batch_id) == ("failed", None, "sent", made[0])
        assert "mia's quota is full: 1 batches not yet ended, of 1 at once" in (failed.failure_reason or "")
    listed = CliRunner().invoke(main, ["schedule", "list"])
    assert f"schedule {refused} failed: mia's quota is full" in listed.output, listed.output
    assert _counts(clean)["batches"] == 2 and len(held) == 2


# --- where waiting work stands ----------------------------------------------------------------------------


def _measured_renders(settings, seconds: list[float], *, backend: str) -> None:
    """Finished attempts as a gpu worker records them (the render's measured seconds and the backend), written
    here: this test runs no renders."""
    with session_scope(settings) as session:
        done = Batch(request="earlier work", kind="batch", theme="earlier", total=len(seconds), status=BatchStatus.done)
        session.add(done)
        session.flush()
        for n, value in enumerate(seconds, start=1):
            video = Video(batch_id=done.id, position=n, concept=f"earlier {n}", state=VideoState.accepted)
            session.add(video)
            session.flush()
            session.add(
                Attempt(video_id=video.id, number=1, prompt="p", backend=backend, render_seconds=value,
                        finished_at=datetime.now(UTC))
            )  # fmt: skip


def test_a_batch_queued_behind_another_says_the_renders_ahead_and_when_each_may_start(clean, held):
    settings = clean.changed(write_ahead=2)
    http = TestClient(create_app(settings), raise_server_exceptions=False)
    first = production.submit(settings, STUDIO, _request(3, "owls"))
    second = production.submit(settings, STUDIO, _request(2, "moths"))
    a = _plan_by_hand(settings, first, [VideoState.waiting] * 3)
    b = _plan_by_hand(settings, second, [VideoState.waiting] * 2)
    with session_scope(settings) as session:
        assert [p.video_id for p, _ in pacing.release(settings, session)] == a[:2]  # as a plan lets them through
        session.execute(sa.update(Video).where(Video.id == a[0]).values(state=VideoState.rendering))  # written

    def where(batch_id: int) -> dict[int, tuple]:
        body = http.get(f"/api/v1/batches/{batch_id}").json()
        return {v["id"]: (v["state"], v["renders_ahead"], v["estimated_start"]) for v in body["videos"]}

    # ahead of the moths: the owl rendering, the owl being written, the owl still waiting
    assert where(second) == {b[0]: ("waiting", 3, None), b[1]: ("waiting", 4, None)}  # nothing measured: unknown
    assert where(first) == {a[0]: ("rendering", None, None), a[1]: ("writing", 1, None), a[2]: ("waiting", 2, None)}
    status = CliRunner().invoke(main, ["status", str(second)])
    assert status.exit_code == 0 and f"video {b[0]} waits: 3 renders ahead, start unknown" in status.output, status.output

    _measured_renders(settings, [30.0, 50.0, 40.0], backend=settings.video.backend)  # median 40 s
    _measured_renders(settings, [900.0] * 5, backend="elsewhere")  # another backend's renders do not count
    asked = datetime.now(UTC)
    video = http.get(f"/api/v1/videos/{b[0]}").json()
    start = datetime.fromisoformat(video["estimated_start"])
    assert video["renders_ahead"] == 3 and abs((start - asked).total_seconds() - 3 * 40) < 30
    assert f"video {b[0]} waits: 3 renders ahead, starts ~" in CliRunner().invoke(main, ["status", str(second)]).output

    urgent = production.submit(settings, STUDIO, _request(2, "herons"), priority="high")  # an A/B test a person awaits
    _plan_by_hand(settings, urgent, [pacing.first_state("high")] * 2)
    assert {ahead for _, ahead, _ in where(second).values()} == {5, 6}  # the urgent work goes first
    with session_scope(settings) as session:
        session.execute(sa.update(Batch).where(Batch.id == first).values(status=BatchStatus.paused))
    assert where(first)[a[2]][1] is None  # a paused batch waits for `mas continue`, in no line
    assert where(second)[b[0]][1] == 2  # the herons only
    assert len(held) == 3


def test_a_newcomers_place_in_line_follows_the_fair_share(clean, held):
    """ben's one video, asked for after ana's five, is next in line (behind the one of hers already let
    through), not behind all of hers."""
    from mas.reports import queries

    settings = clean.changed(write_ahead=1)
    first = production.submit(settings, Actor("ana"), _request(5, "owls"))
    a = _plan_by_hand(settings, first, [VideoState.waiting] * 5)
    with session_scope(settings) as session:
        assert [p.video_id for p, _ in pacing.release(settings, session)] == a[:1]
    second = production.submit(settings, Actor("ben"), _request(1, "moths"))
    (b,) = _plan_by_hand(settings, second, [VideoState.waiting])
    assert queries.batch_places(settings, second)[b].renders_ahead == 1  # ana's a[0], being written
    assert [queries.batch_places(settings, first)[v].renders_ahead for v in a] == [0, 2, 3, 4, 5]
    assert len(held) == 2
