"""A database blink costs no GPU work: a render running while PostgreSQL is away goes on, keeps its result and
records it once the database answers, while `mas enqueue --wait` rides through saying "database failing over";
a render whose record could not wait that long is taken up again by its own worker at once, not after its
lease's expiry. Real workers, PostgreSQL and Redis (an isolated studio), renders of a few seconds; every wait is
for an event in a log or the database, with a deadline.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from mas import db
from mas.domain.identity import STUDIO
from mas.models import Batch, VideoState
from mas.pipeline import leases
from mas.runtime import services
from tests.rows import one_video
from tests.studio import ROOT, IsolatedStudio


@pytest.fixture
def data_dir():
    with tempfile.TemporaryDirectory(prefix="mas-blink-") as tmp:
        Path(tmp).chmod(0o755)  # as root, the embedded PostgreSQL runs as another user that must enter it
        yield Path(tmp)


class Watcher:
    """`mas enqueue --wait REQUEST` running in the background, its output in files read as it goes."""

    def __init__(self, studio: IsolatedStudio, request: str) -> None:
        self.out, self.err = studio.data_dir / "wait.out", studio.data_dir / "wait.err"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mas.cli", "enqueue", "--wait", request], env=studio.env, cwd=ROOT,
            stdout=self.out.open("w"), stderr=self.err.open("w"),
        )  # fmt: skip

    def said(self, text: str) -> bool:
        return text in self.err.read_text()

    def finish(self, timeout: float) -> tuple[int, str, str]:
        code = self.proc.wait(timeout)
        return code, self.out.read_text(), self.err.read_text()


def _batch_id(studio: IsolatedStudio) -> int | None:
    with db.session_scope(studio.settings) as s:
        return s.scalar(sa.select(sa.func.max(Batch.id)))


def _render_lines(studio: IsolatedStudio, what: str) -> list[str]:
    """Lines of every worker's log about renders: `what` is "rendered in" or "recorded"."""
    pattern = re.compile(rf"render of video \d+ attempt \d+ {what}")
    return [line for w in studio.workers for line in w.log.read_text().splitlines() if pattern.search(line)]


def _log(studio: IsolatedStudio) -> str:
    return "".join(w.log.read_text() for w in studio.workers)


def _render_started(studio: IsolatedStudio) -> int | None:
    """The video whose render holds its lease now, once the batch exists."""
    batch_id = _batch_id(studio)
    lease = studio.render_running(batch_id) if batch_id is not None else None
    return lease.video_id if lease is not None else None


def test_a_render_goes_on_through_a_database_restart_and_is_recorded_once_while_wait_rides_through(data_dir):
    """The database stops while a video renders and starts again only once the render has finished and is
    waiting to record: the render is neither stopped nor done again, its result is recorded once, and `mas
    enqueue --wait`, which polled the stopped database meanwhile, says so on stderr and exits 0."""
    with IsolatedStudio(data_dir, MAS_PREVIEW_RENDER_SECONDS="5") as studio:
        studio.worker("cpu")
        studio.worker("gpu")
        watcher = Watcher(studio, "Create a video of tide pools")
        studio.wait_until(lambda: _render_started(studio) is not None, what="a render to hold its lease")
        video_id = _render_started(studio)
        services.stop_postgres(studio.settings)
        studio.wait_until(
            lambda: "goes on: cannot ask whether it was cancelled" in _log(studio), timeout=30,
            what="the render's cancellation poll to meet the stopped database",
        )  # fmt: skip
        studio.wait_until(
            lambda: f"render of video {video_id} attempt 1 waits" in _log(studio), timeout=60,
            what="the finished render to wait for the database to record it",
        )  # fmt: skip
        studio.wait_until(lambda: watcher.said("database failing over"), timeout=30, what="the watcher to say so")
        services.start_postgres(studio.settings)
        code, out, err = watcher.finish(timeout=180)
        assert code == 0, out + err
        assert "database answers again" in err
        batch_id = int(out.split()[1].rstrip(":"))
        (video,) = studio.videos(batch_id)
        assert video.state == VideoState.accepted
        log = _log(studio)
    attempts = video.attempt_count
    assert len(_render_lines(studio, "rendered in")) == attempts, _render_lines(studio, "rendered in")
    assert len(_render_lines(studio, "recorded")) == attempts
    assert "LeaseHeld" not in log and "RenderStopped" not in log


def test_a_render_whose_record_gave_up_is_taken_again_by_its_worker_without_waiting_out_the_lease(data_dir):
    """The database stays away longer than a render may wait to record (MAS_DATABASE_WAIT_SECONDS, scaled to
    1 s), so the render takes its retryable path with its lease unreleased. Once the database answers, the same
    worker takes the step up again at once: long before the lease's expiry, and never `LeaseHeld`."""
    expiry = 60.0
    with IsolatedStudio(
        data_dir, MAS_PREVIEW_RENDER_SECONDS="3", MAS_DATABASE_WAIT_SECONDS="1",
        MAS_LEASE_HEARTBEAT_SECONDS=str(expiry / 4), MAS_LEASE_EXPIRY_SECONDS=str(expiry),
    ) as studio:  # fmt: skip
        studio.worker("cpu")
        gpu = studio.worker("gpu")
        batch_id = studio.enqueue("Create a video of glaciers")
        studio.wait_until(lambda: studio.render_running(batch_id) is not None, what="a render to hold its lease")
        services.stop_postgres(studio.settings)
        studio.wait_until(
            lambda: "lease not released yet" in gpu.log.read_text(), timeout=60,
            what="the render to give up recording and leave its lease unreleased",
        )  # fmt: skip
        services.start_postgres(studio.settings)
        back = time.monotonic()
        studio.wait_batch(batch_id, timeout=expiry)
        took = time.monotonic() - back
        log = gpu.log.read_text()
        (video,) = studio.videos(batch_id)
    assert took < expiry / 2, f"the batch took {took:.0f} s after the database came back"
    assert "LeaseHeld" not in log
    assert len(_render_lines(studio, "recorded")) == video.attempt_count


def test_a_lease_left_held_by_a_database_that_went_away_is_taken_back_by_its_own_process(data_dir):
    """A step ends while the database is away: its lease cannot be released. Once the database answers, the
    same process's next claim of the step (its retry) gets it at once, not counted as a holder that died,
    instead of waiting out the expiry; while that claim holds it, another delivery still finds it held."""
    with IsolatedStudio(data_dir, MAS_LEASE_HEARTBEAT_SECONDS="100", MAS_LEASE_EXPIRY_SECONDS="600") as studio:
        settings = studio.settings
        with db.session_scope(settings) as session:
            video = one_video(session, request="a render", concept="a render", state=VideoState.rendering)
            step = {"video_id": video.id, "attempt": 1, "step": "render"}
        with leases.held(settings, **step, worker="gpu@blink") as first:
            assert first is not None and first.claims == 1
            services.stop_postgres(settings)
        assert leases.unreleased().holds(first)  # kept: its release met no database
        services.start_postgres(settings)

        again = leases.claim(settings, **step, worker="gpu@blink")
        assert again is not None and again.claims == 1, again  # at once, and no death counted
        assert not leases.unreleased().holds(first)
        assert leases.claim(settings, **step, worker="gpu@other") is None  # held again, by the retry


def test_an_event_stream_rides_through_a_database_restart_saying_so(data_dir):
    """The database stops under an open event stream: the stream stays open saying "database failing over"
    at each poll, says when the database answers again, and carries the next event as usual."""
    from starlette.testclient import TestClient

    from mas.gallery import create_app
    from tests.system.test_event_stream import messages, new_batch

    with IsolatedStudio(data_dir) as studio:
        settings = studio.settings.changed(stream_poll_seconds=0.05, stream_keepalive_seconds=0.5)
        http = TestClient(create_app(settings))
        with http.stream("GET", "/api/v1/events") as reply:
            stream = messages(reply)
            assert next(stream).retry is not None
            assert next(stream).comment == "keep-alive"  # caught up
            services.stop_postgres(settings)
            _comments_until(stream, "database failing over")
            assert next(stream).comment == "database failing over"  # said at each poll while it waits
            services.start_postgres(settings)
            batch_id = new_batch(settings, STUDIO.user)
            comments, first = [], next(stream)
            while first.event is None:
                comments.append(first.comment)
                first = next(stream)
    assert "database answers again" in comments
    assert first.id is not None and first.body["data"]["batch_id"] == batch_id


def _comments_until(stream, text: str, deadline_s: float = 60) -> None:
    """Read a stream's comments up to the first saying `text` (an event meanwhile, or the stream's end, fails)."""
    deadline, said = time.monotonic() + deadline_s, []
    for message in stream:
        assert message.event is None and time.monotonic() < deadline, (message, said)
        said.append(message.comment)
        if message.comment == text:
            return
    raise AssertionError(f"the stream ended before saying {text!r}: {said}")
