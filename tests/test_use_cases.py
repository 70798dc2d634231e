"""The whitepaper's 8 use cases end to end: real Redis, Postgres + pgvector, a cpu and a gpu worker."""

import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from mas import db
from mas.cli import main
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


def enqueue(request: str) -> int:
    result = run_cli("enqueue", request)
    assert result.exit_code == 0, result.output
    return int(result.output.split()[1].rstrip(":"))


def test_batch_production(clean, workers):
    batch_id = enqueue("Create 4 videos of mythical creatures")
    wait_batch(clean, batch_id)
    videos = videos_of(clean, batch_id)
    assert len(videos) == 4 and len({v.concept for v in videos}) == 4
    assert all(v.state in (VideoState.accepted, VideoState.failed) for v in videos)
    for v in videos:
        if v.state == VideoState.accepted:
            assert Path(v.output_path).stat().st_size > 1000
    queue = blocks.read(clean, "production_queue")
    assert queue["BATCH_ID"] == str(batch_id) and queue["BATCH_TOTAL"] == 4 and queue["BATCH_COMPLETE"] == 4
    assert queue["PENDING_VIDEOS"] == [] and queue["QUEUE_STATUS"] == "complete"
    assert {e["video_id"] for e in queue["COMPLETED_TODAY"]} == {v.id for v in videos if v.state == VideoState.accepted}
    with db.session_scope(clean) as s:  # an archival entry for every attempt
        n_attempts = s.scalar(sa.select(sa.func.count()).select_from(Attempt).join(Video).where(Video.batch_id == batch_id))
        assert s.scalar(sa.select(sa.func.count()).select_from(ArchivalPassage).where(ArchivalPassage.tags.contains(["quality"]))) == n_attempts
