"""The gallery's routes against real Postgres, with a batch, a series and an A/B test made by real workers."""

from __future__ import annotations

import io
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from markupsafe import escape
from PIL import Image
from pydantic import SecretStr
from starlette.testclient import TestClient

from mas.cli import main
from mas.db import session_scope
from mas.domain.identity import STUDIO, Actor
from mas.gallery import GalleryError, create_app, serve, server
from mas.gallery.frames import FRAME_HEIGHT, STRIP_FRAMES, _strip
from mas.memory import blocks
from mas.models import (
    ABSelection,
    ABTest,
    Attempt,
    Batch,
    BatchStatus,
    MemoryBlock,
    MemoryBlockChange,
    Series,
    Video,
    VideoState,
)
from tests.studio import wait_quiet


def submitted(*args: str) -> int:
    """Run a `mas` command that queues a batch; its id."""
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return int(result.output.split()[1].rstrip(":"))


BATCHES_DEADLINE = 900
"""Seconds the module's batches get to finish together: a few preview renders take seconds, but on a shared
2-core machine under load the workers may wait long for a core. The wait ends as soon as they are done."""


def where_batches_stand(settings, batch_ids: list[int]) -> str:
    """Each batch's status and its videos' states, for a failure message."""
    with session_scope(settings) as s:
        return "; ".join(
            f"batch {b}: {s.get(Batch, b).status.value}, videos "
            + str([(v.id, v.state.value, v.attempt_count, v.failure_reasons)
                   for v in s.scalars(sa.select(Video).where(Video.batch_id == b).order_by(Video.id))])
            for b in batch_ids
        )


def wait_batches(settings, batch_ids: list[int], timeout: float = BATCHES_DEADLINE) -> None:
    """Poll until every batch is done; stop at once if one ends otherwise, and at the deadline say where each
    batch stood."""
    deadline = time.monotonic() + timeout
    while True:
        with session_scope(settings) as s:
            statuses = [s.get(Batch, b).status for b in batch_ids]
        if all(status == BatchStatus.done for status in statuses):
            return
        if any(status in (BatchStatus.failed, BatchStatus.cancelled) for status in statuses):
            raise AssertionError(f"a batch ended without finishing: {where_batches_stand(settings, batch_ids)}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"not done after {timeout} s: {where_batches_stand(settings, batch_ids)}")
        time.sleep(0.5)


@dataclass(frozen=True)
class Studio:
    batch: int
    series: int
    series_batch: int
    ab_batch: int
    test: int


@pytest.fixture(scope="module")
def studio(settings, workers) -> Studio:  # noqa: ARG001  # the workers render its batch
    """One finished batch, series episode and A/B test for the whole module: rendering is the slow part."""
    style = CliRunner().invoke(main, ["style", "I prefer dark moody aesthetics with purple and blue tones"])
    assert style.exit_code == 0, style.output
    batch = submitted("enqueue", "Create 2 videos of paper lanterns")
    series_batch = submitted("series", "Lantern Keepers", "--episodes", "1")
    ab_batch = submitted("ab", "a heron at dawn", "--variations", "2")
    wait_batches(settings, [batch, series_batch, ab_batch])
    with session_scope(settings) as s:
        series, test = s.get(Batch, series_batch).series_id, s.get(Batch, ab_batch).ab_test_id
    return Studio(batch=batch, series=series, series_batch=series_batch, ab_batch=ab_batch, test=test)


@pytest.fixture(scope="module")
def client(settings) -> TestClient:
    return TestClient(create_app(settings))


def videos_of(settings, batch_id: int) -> list[Video]:
    with session_scope(settings) as s:
        return list(s.scalars(sa.select(Video).where(Video.batch_id == batch_id).order_by(Video.position)))


def last_attempt(settings, video: Video) -> Attempt:
    with session_scope(settings) as s:
        return s.scalars(sa.select(Attempt).where(Attempt.video_id == video.id).order_by(Attempt.number.desc())).first()


def snapshot(settings) -> tuple:
    """Everything a pick may change: the memory blocks, the selections and the tests' states."""
    with session_scope(settings) as s:
        selections = s.scalar(sa.select(sa.func.count()).select_from(ABSelection))
        tests = s.execute(sa.select(ABTest.id, ABTest.status, ABTest.winner_label).order_by(ABTest.id)).all()
    return blocks.read_all(settings, STUDIO), selections, tests


def test_index_lists_batches_series_tests_and_learned_style(client, studio):
    page = client.get("/")
    assert page.status_code == 200
    for batch_id in (studio.batch, studio.series_batch, studio.ab_batch):
        assert f'href="/batches/{batch_id}"' in page.text and f'data-batch="{batch_id}"' in page.text
    assert "Create 2 videos of paper lanterns" in page.text and "2/2" in page.text
    assert f'href="/series/{studio.series}"' in page.text and "Lantern Keepers" in page.text
    assert f'href="/ab/{studio.test}"' in page.text and "a heron at dawn" in page.text
    assert "Learned style" in page.text and "purple, blue" in page.text


def test_batch_page_plays_each_video_with_prompt_grade_scores_and_frames(client, settings, studio):
    page = client.get(f"/batches/{studio.batch}")
    assert page.status_code == 200
    videos = videos_of(settings, studio.batch)
    assert len(videos) == 2
    for video in videos:
        rel = Path(video.output_path).relative_to(settings.videos_dir).as_posix()
        assert f'<video controls preload="metadata" src="/files/{rel}">' in page.text
        assert f'src="/videos/{video.id}/frames.jpg"' in page.text
        assert f"grade {video.grade}" in page.text
        attempt = last_attempt(settings, video)
        assert str(escape(attempt.prompt)) in page.text
        for axis, value in attempt.scores.items():
            assert f"<td>{axis}</td>" in page.text and f"{value:.2f}" in page.text


def test_progress_endpoint_reports_a_finished_batch(client, settings, studio):
    progress = client.get(f"/api/v1/batches/{studio.batch}").json()  # what the pages poll
    assert progress["status"] == "done" and progress["done"] == progress["total"] == 2
    assert [v["id"] for v in progress["videos"]] == [v.id for v in videos_of(settings, studio.batch)]
    assert all(v["state"] in ("accepted", "failed") and v["attempts"] >= 1 for v in progress["videos"])
    states = [v["state"] for v in progress["videos"]]
    assert (progress["accepted"], progress["failed"]) == (states.count("accepted"), states.count("failed"))
    listed = client.get("/api/v1/batches").json()  # the list counts the same, in one query
    assert [(b["accepted"], b["failed"]) for b in listed if b["id"] == studio.batch] == [
        (progress["accepted"], progress["failed"])]
    page = client.get(f"/batches/{studio.batch}")
    assert f'({progress["accepted"]} accepted, {progress["failed"]} failed)' in page.text


def test_video_file_is_served_whole_and_by_range(client, settings, studio):
    video = videos_of(settings, studio.batch)[0]
    data = Path(video.output_path).read_bytes()
    url = "/files/" + Path(video.output_path).relative_to(settings.videos_dir).as_posix()
    whole = client.get(url)
    assert whole.status_code == 200 and whole.headers["content-type"] == "video/mp4" and whole.content == data
    part = client.get(url, headers={"Range": "bytes=100-299"})
    assert part.status_code == 206 and part.content == data[100:300]
    assert part.headers["content-range"] == f"bytes 100-299/{len(data)}"


def test_frame_strip_is_a_jpeg_of_a_few_frames_and_cached(client, settings, studio):
    video = videos_of(settings, studio.batch)[0]
    hits = _strip.cache_info().hits
    first = client.get(f"/videos/{video.id}/frames.jpg")
    assert first.status_code == 200 and first.headers["content-type"] == "image/jpeg"
    image = Image.open(io.BytesIO(first.content))
    assert image.format == "JPEG" and image.height == FRAME_HEIGHT
    assert image.width > (STRIP_FRAMES - 1) * FRAME_HEIGHT  # several frames side by side
    again = client.get(f"/videos/{video.id}/frames.jpg")
    assert again.content == first.content and _strip.cache_info().hits > hits


def test_series_page_shows_its_style_and_episodes(client, settings, studio):
    page = client.get(f"/series/{studio.series}")
    assert page.status_code == 200
    with session_scope(settings) as s:
        series = s.get(Series, studio.series)
    assert series.name == "Lantern Keepers" and series.style and series.consistency_rules
    assert str(escape(series.style)) in page.text and f'href="/batches/{studio.series_batch}"' in page.text
    assert f"{series.episodes_completed} done of 1 planned" in page.text


def memory_tables(settings) -> tuple:
    """Every stored block (label, version, value, change times) and every recorded change."""
    with session_scope(settings) as s:
        stored = s.execute(sa.select(MemoryBlock.label, MemoryBlock.version, MemoryBlock.value,
                                     MemoryBlock.field_updated_at).order_by(MemoryBlock.label)).all()
        changes = s.execute(sa.select(MemoryBlockChange.id, MemoryBlockChange.label)
                            .order_by(MemoryBlockChange.id)).all()
    return stored, changes


def test_opening_the_gallery_as_a_new_user_writes_nothing(settings):
    newcomer = TestClient(create_app(settings, operator=Actor("gallery-newcomer")))
    wait_quiet(settings)  # the module's batches have ended and their last listeners written the blocks
    before = memory_tables(settings)
    for path in ("/", "/memory"):
        page = newcomer.get(path)
        assert page.status_code == 200, page.text[:300]
    assert "MIN_ACCEPTABLE_GRADE" in page.text  # the defaults are shown, unwritten
    assert memory_tables(settings) == before


@pytest.mark.usefixtures("studio")
def test_memory_page_shows_the_six_blocks_read_only(client, settings):
    page = client.get("/memory")
    assert page.status_code == 200
    for label in blocks.SCHEMAS:
        assert f'id="block-{label}"' in page.text
    assert "purple, blue" in page.text and "MIN_ACCEPTABLE_GRADE" in page.text
    before = blocks.read_all(settings, STUDIO)
    assert client.post("/memory").status_code == 405
    assert blocks.read_all(settings, STUDIO) == before


@pytest.mark.parametrize(
    "url",
    [
        "/batches/999999", "/batches/99999999999999999999", "/batches/abc", "/series/999999", "/ab/999999",
        "/videos/999999/frames.jpg", "/api/v1/batches/999999", "/nowhere",
    ],
)
def test_a_bad_id_is_a_clear_not_found(client, url):
    response = client.get(url)
    assert response.status_code == 404
    if url.startswith("/api/"):
        assert response.json()["detail"] == "there is no batch 999999"
    else:
        assert 'id="error"' in response.text and ("there is no" in response.text)


@pytest.mark.usefixtures("studio")
@pytest.mark.parametrize(
    "path",
    ["%2e%2e/outside.mp4", "..%2foutside.mp4", "batch-1/%2e%2e/%2e%2e/outside.mp4", "/etc/passwd", "%2fetc%2fpasswd",
     "escape-link.mp4", "loop-link.mp4", "a%00b.mp4", "batch-1", "no-such-file.mp4", ""],
)
def test_a_file_outside_the_output_folder_is_never_served(client, settings, path):
    outside = settings.videos_dir.parent / "outside.mp4"
    outside.write_bytes(b"secret, outside the output folder")
    for name, target in (("escape-link.mp4", outside), ("loop-link.mp4", settings.videos_dir / "loop-link.mp4")):
        if not (settings.videos_dir / name).is_symlink():
            (settings.videos_dir / name).symlink_to(target)
    response = client.get(f"/files/{path}")
    assert response.status_code == 404 and b"secret" not in response.content


@pytest.fixture(scope="module")
def broken(settings, studio) -> dict[str, int]:
    """Videos whose file is missing, lies outside the output folder, or is not a video at all."""
    real = Path(videos_of(settings, studio.batch)[0].output_path)
    folder = settings.videos_dir / "gallery-broken"
    folder.mkdir(exist_ok=True)
    (folder / "corrupt.mp4").write_bytes(b"this is not an mp4")
    shutil.copy(real, settings.videos_dir.parent / "elsewhere.mp4")
    paths = {
        "missing": folder / "gone.mp4",
        "outside": settings.videos_dir.parent / "elsewhere.mp4",
        "corrupt": folder / "corrupt.mp4",
    }
    with session_scope(settings) as s:
        batch = Batch(request="broken files", kind="batch", theme="broken", total=3, status=BatchStatus.done)
        s.add(batch)
        s.flush()
        rows = {
            name: Video(batch_id=batch.id, position=i, concept=name, state=VideoState.accepted, grade="B",
                        output_path=str(path))
            for i, (name, path) in enumerate(paths.items(), start=1)
        }
        s.add_all(rows.values())
        s.flush()
        return {"batch": batch.id, **{name: v.id for name, v in rows.items()}}


def test_a_missing_outside_or_corrupt_file_is_named_not_served(client, broken):
    page = client.get(f"/batches/{broken['batch']}")
    assert page.status_code == 200
    assert "its file gone.mp4 is missing" in page.text
    assert "outside the output folder and is not served" in page.text
    assert "elsewhere.mp4" not in page.text
    missing = client.get(f"/videos/{broken['missing']}/frames.jpg")
    assert missing.status_code == 404 and "gone.mp4 is missing" in missing.text
    assert client.get(f"/videos/{broken['outside']}/frames.jpg").status_code == 404
    corrupt = client.get(f"/videos/{broken['corrupt']}/frames.jpg")
    assert corrupt.status_code == 422 and "corrupt.mp4 could not be decoded" in corrupt.text


def test_ab_page_shows_the_variations_side_by_side_and_a_pick_records_the_winner(client, settings, studio):
    page = client.get(f"/ab/{studio.test}")
    assert page.status_code == 200 and 'id="variations"' in page.text
    for label in ("A", "B"):
        assert f'action="/ab/{studio.test}/pick/{label}"' in page.text and f"Pick {label} as the winner" in page.text
    for video in videos_of(settings, studio.ab_batch):
        assert f'data-video="{video.id}"' in page.text
    origin = {"Origin": "http://testserver"}

    before = snapshot(settings)
    cross_site = client.post(f"/ab/{studio.test}/pick/A", headers={"Origin": "https://evil.example"})
    assert cross_site.status_code == 403 and "another site" in cross_site.text
    unknown = client.post(f"/ab/{studio.test}/pick/Z", headers=origin)
    assert unknown.status_code == 409 and "has no variation &#39;Z&#39;" in unknown.text
    assert f'href="/ab/{studio.test}"' in unknown.text  # a way back to the test
    missing = client.post("/ab/999999/pick/A", headers=origin)
    assert missing.status_code == 404 and "there is no A/B test 999999; nothing changed" in missing.text
    assert snapshot(settings) == before

    picked = client.post(f"/ab/{studio.test}/pick/b", headers=origin, follow_redirects=False)
    assert picked.status_code == 303 and picked.headers["location"] == f"/ab/{studio.test}"
    ab = blocks.read(settings, STUDIO, "ab_testing")
    assert ab["USER_SELECTIONS"][-1]["test"] == str(studio.test) and ab["USER_SELECTIONS"][-1]["label"] == "B"
    with session_scope(settings) as s:
        test = s.get(ABTest, studio.test)
        assert (test.status, test.winner_label) == ("closed", "B")
    shown = client.get(f"/ab/{studio.test}")
    assert "Winner: B" in shown.text and "as the winner</button>" not in shown.text

    after = snapshot(settings)
    closed = client.post(f"/ab/{studio.test}/pick/A", headers=origin)
    assert closed.status_code == 409 and f"A/B test {studio.test} is closed (winner B); nothing changed" in closed.text
    assert snapshot(settings) == after


def test_basic_auth_is_enforced_when_credentials_are_set(settings, studio):
    guarded = settings.model_copy(update={"gallery_user": "ana", "gallery_password": SecretStr("s3cret:pw")})
    client = TestClient(create_app(guarded))
    refused = client.get("/")
    assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Basic ")
    assert client.get("/", auth=("ana", "wrong")).status_code == 401
    assert client.get("/", auth=("bob", "s3cret:pw")).status_code == 401
    assert client.get("/", headers={"Authorization": "Basic !!!"}).status_code == 401
    assert client.get(f"/api/v1/batches/{studio.batch}").status_code == 401
    assert client.get("/", auth=("ana", "s3cret:pw")).status_code == 200
    video = videos_of(settings, studio.batch)[0]
    url = "/files/" + Path(video.output_path).relative_to(settings.videos_dir).as_posix()
    assert client.get(url).status_code == 401 and client.get(url, auth=("ana", "s3cret:pw")).status_code == 200


def test_an_unreachable_database_is_a_clear_page(settings):
    gone = settings.model_copy(update={"database_url": "postgresql://mas@127.0.0.1:1/mas"})
    page = TestClient(create_app(gone)).get("/")
    assert page.status_code == 503 and "cannot reach PostgreSQL at" in page.text and "127.0.0.1:1/mas" in page.text


def test_half_a_credential_pair_is_refused(settings):
    with pytest.raises(GalleryError, match="set both MAS_GALLERY_USER and MAS_GALLERY_PASSWORD"):
        create_app(settings.model_copy(update={"gallery_user": "ana"}))


def test_serving_beyond_loopback_requires_credentials(settings):
    for host in ("0.0.0.0", "192.168.1.20", "::"):
        with pytest.raises(GalleryError, match="without credentials: add users"):
            serve(settings, host=host, port=0)  # refused before anything binds
    guarded = settings.model_copy(update={"gallery_user": "ana", "gallery_password": SecretStr("pw")})
    assert server(guarded, host="0.0.0.0", port=0).config.host == "0.0.0.0"


@pytest.mark.usefixtures("studio")
def test_a_loopback_server_answers_only_to_loopback_host_names(settings):
    app = server(settings, host="127.0.0.2", port=0).config.app
    for base in ("http://127.0.0.1:8000", "http://localhost:8000", "http://[::1]:8000", "http://127.0.0.2:8000"):
        assert TestClient(app, base_url=base).get("/").status_code == 200
    client = TestClient(app, base_url="http://127.0.0.1:8000")
    for host in ("attacker.example:8000", "127.0.0.3", "[::1", ""):  # DNS rebinding, or a broken header
        refused = client.get("/", headers={"Host": host})
        assert refused.status_code == 400 and "loopback host names" in refused.text


def _held_batch(settings, videos: int) -> tuple[int, list[int]]:
    """A running batch whose videos no message carries (nothing renders them meanwhile)."""
    with session_scope(settings) as s:
        batch = Batch(request="Create videos of tide pools", kind="batch", theme="tide pools", total=videos,
                      status=BatchStatus.running)
        s.add(batch)
        s.flush()
        rows = [Video(batch_id=batch.id, position=n, concept=f"tide pool {n}") for n in range(1, videos + 1)]
        s.add_all(rows)
        s.flush()
        return batch.id, [v.id for v in rows]


def _status(settings, batch_id: int) -> BatchStatus:
    with session_scope(settings) as s:
        return s.get(Batch, batch_id).status


@pytest.mark.usefixtures("workers")
def test_batch_page_buttons_pause_and_cancel_as_the_commands_do(client, settings):
    batch_id, video_ids = _held_batch(settings, 2)  # noqa: RUF059
    origin = {"Origin": "http://testserver"}
    page = client.get(f"/batches/{batch_id}")
    assert f'action="/batches/{batch_id}/pause"' in page.text and f'action="/batches/{batch_id}/cancel"' in page.text

    cross_site = client.post(f"/batches/{batch_id}/cancel", headers={"Origin": "https://evil.example"})
    assert cross_site.status_code == 403 and _status(settings, batch_id) == BatchStatus.running
    assert client.post(f"/batches/{batch_id}/explode", headers=origin).status_code == 404

    paused = client.post(f"/batches/{batch_id}/pause", headers=origin, follow_redirects=False)
    assert paused.status_code == 303 and _status(settings, batch_id) == BatchStatus.paused
    assert f'action="/batches/{batch_id}/continue"' in client.get(f"/batches/{batch_id}").text

    cancelled = client.post(f"/batches/{batch_id}/cancel", headers=origin, follow_redirects=False)
    assert cancelled.status_code == 303 and _status(settings, batch_id) == BatchStatus.cancelled
    assert {v.state for v in videos_of(settings, batch_id)} == {VideoState.cancelled}
    again = client.post(f"/batches/{batch_id}/continue", headers=origin)
    assert again.status_code == 409 and "not paused; nothing changed" in again.text
    assert "/cancel" not in client.get(f"/batches/{batch_id}").text  # a cancelled batch offers no buttons


def test_cancelling_each_video_of_a_batch_finishes_it(settings):
    batch_id, (first, second) = _held_batch(settings, 2)
    runner = CliRunner()
    result = runner.invoke(main, ["cancel", "--video", str(first)])
    assert result.exit_code == 0 and f"video {first} cancelled" in result.output
    assert _status(settings, batch_id) == BatchStatus.running  # the batch goes on with its other video
    assert runner.invoke(main, ["cancel", "--video", str(second)]).exit_code == 0
    assert _status(settings, batch_id) == BatchStatus.done
    twice = runner.invoke(main, ["cancel", "--video", str(first)])
    assert twice.exit_code == 1 and "already cancelled; nothing changed" in twice.output
    neither = runner.invoke(main, ["cancel"])
    assert neither.exit_code == 2 and "give a BATCH" in neither.output


# --- one studio, many users: a member sees and changes nothing of another's -------------------------

A_MARKS = ("paper lanterns", "Lantern Keepers", "heron", "purple")
"""Words only the module's user ("default") has in their batches, series, test and style."""
MISSING = 987654  # an id no row has (a larger one is refused by the gallery's id convertor)


def every_route(app) -> list[tuple[str, str]]:
    """Every (path, verb) the gallery and its mounted API answer, from the apps themselves."""
    from starlette.routing import Mount, Route

    pairs = []
    for route in app.routes:
        if isinstance(route, Mount):  # the API: every operation its OpenAPI document names, and the document's own
            paths = route.app.openapi()["paths"]
            pairs += [(route.path + path, verb.upper()) for path, item in paths.items() for verb in item]
            pairs += [(route.path + path, verb) for path, verb in every_route(route.app)]
        elif isinstance(route, Route):
            pairs += [(route.path, method) for method in sorted((route.methods or {"GET"}) - {"HEAD"})]
    return pairs


def streamed(http, url: str, headers: dict[str, str]) -> tuple[int, str]:
    """An event stream's status and what it sends until its first keep-alive (all it had to send)."""
    with http.stream("GET", url, headers=headers) as reply:
        if reply.status_code != 200:
            return reply.status_code, reply.read().decode()
        text = ""
        for chunk in reply.iter_text():
            text += chunk
            if ": keep-alive" in text:
                return 200, text
    return reply.status_code, text


def everything_counted(settings) -> dict:
    """Each table's rows, and what an action or a pick would change in place."""
    with session_scope(settings) as s:
        tables = s.execute(
            sa.text("select tablename from pg_tables where schemaname='public' and tablename<>'alembic_version'")
        ).scalars().all()
        counts = {t: s.scalar(sa.text(f"select count(*) from {t}")) for t in tables}
        batches = s.execute(sa.select(Batch.id, Batch.status, Batch.updated_at).order_by(Batch.id)).all()
        videos = s.execute(sa.select(Video.id, Video.state).order_by(Video.id)).all()
        tests = s.execute(sa.select(ABTest.id, ABTest.status, ABTest.winner_label).order_by(ABTest.id)).all()
        memory = s.execute(sa.select(MemoryBlock.label, MemoryBlock.version).order_by(MemoryBlock.label)).all()
    return {"counts": counts, "batches": batches, "videos": videos, "tests": tests, "memory": memory}


def test_a_member_finds_nothing_of_another_members_work_on_any_route(settings, studio):
    from mas.accounts import users
    from mas.learning import style_book

    keys = {"default": users.add(settings, "default"), "bob": users.add(settings, "bob"),
            "root": users.add(settings, "root", role="admin")}  # fmt: skip
    try:
        app = create_app(settings.changed(stream_keepalive_seconds=0.5))  # an event stream soon says it is caught up
        http = TestClient(app, raise_server_exceptions=False)
        as_ = {name: {"Authorization": f"Bearer {key}"} for name, key in keys.items()}
        video = videos_of(settings, studio.batch)[0]
        a_objects = {"batch_id": studio.batch, "series_id": studio.series, "test_id": studio.test,
                     "video_id": video.id, "path": Path(video.output_path).relative_to(settings.videos_dir).as_posix(),
                     "item_id": style_book.entries(settings, STUDIO)[0].id}  # fmt: skip
        body = {"/api/v1/batches": {"theme": "owls", "count": 1, "user": "default"}, "/api/v1/ab/{test_id}/pick": {"label": "A", "user": "default"},
                "/api/v1/style/items": {"words": "lanterns", "polarity": "liked"}}
        wait_quiet(settings)  # the module's batches write their last memories after they end
        tried, before = [], everything_counted(settings)
        for template, verb in every_route(app):
            if template in ("/healthz", "/readyz"):
                continue  # probes: whether the studio works, nothing anyone owns
            for action in ("cancel", "pause", "continue") if "{action}" in template else (None,):
                params = {name: value for name, value in a_objects.items() if "{" + name in template}
                fill = {**a_objects, "action": action, "label": "A"}
                url = re.sub(r"\{(\w+)(:\w+)?\}", lambda m, fill=fill: str(fill[m.group(1)]), template)
                named = template.startswith("/api/v1/memory") or template == "/api/v1/style/items"
                query = "?user=default" if named else ""
                if template == "/api/v1/events":  # a stream: all it sends bob from the log's start until caught up
                    status, text = streamed(http, url + "?after=0", as_["bob"])
                    tried.append((template, verb, status))
                    assert status == 200 and "retry:" in text, (template, verb, status, text)
                    assert "event:" not in text and not any(mark in text for mark in A_MARKS), text[:300]
                    continue
                reply = http.request(verb, url + query, headers=as_["bob"], json=body.get(template))
                tried.append((template, verb, reply.status_code))
                text = reply.text
                if params:  # one of A's objects: not found, and said exactly as for one that does not exist
                    assert reply.status_code == 404, (template, verb, reply.status_code, text)
                    missing = re.sub(r"\{(\w+)(:\w+)?\}", lambda m, fill=fill, params=params: str(
                        MISSING if m.group(1) in params else fill[m.group(1)]), template)  # fmt: skip
                    if "path" in params:
                        missing = url.replace(a_objects["path"], "nothing.mp4")
                    expected = http.request(verb, missing + query, headers=as_["bob"], json=body.get(template)).text
                    if "path" in params:
                        expected = expected.replace("nothing.mp4", a_objects["path"])
                    for value in params.values():
                        expected = expected.replace(str(MISSING), str(value))
                    assert text == expected, (template, verb)
                elif query or (template == "/api/v1/batches" and verb == "POST"):
                    assert reply.status_code == 403, (template, verb, reply.status_code, text)  # named another user
                elif template == "/metrics":
                    assert reply.status_code == 403  # every user's figures: an admin's
                else:
                    assert reply.status_code == 200, (template, verb, reply.status_code, text)
                assert not any(mark in text for mark in A_MARKS), (template, verb, text[:300])
        assert everything_counted(settings) == before
        assert http.get("/api/v1/batches", headers=as_["bob"]).json() == []
        own = http.get("/api/v1/memory/blocks", headers=as_["bob"]).json()
        assert set(own) == set(blocks.PER_USER) and "purple" not in str(own)
        pairs = {(t, v) for t, v, _ in tried}
        print(f"isolation: {len(pairs)} (route, verb) pairs, {len(tried)} requests as another member")
        assert len(pairs) >= 20

        # the owner and an admin reach the same things
        for who in ("default", "root"):
            assert http.get(f"/api/v1/batches/{studio.batch}", headers=as_[who]).status_code == 200
            assert http.get(f"/batches/{studio.batch}", headers=as_[who]).status_code == 200
            assert http.get(f"/files/{a_objects['path']}", headers=as_[who]).status_code == 200
        done = http.post(f"/api/v1/batches/{studio.batch}/cancel", headers=as_["root"])
        assert done.status_code == 409 and "nothing changed" in done.text  # reached: a finished batch stays so
        assert http.get("/metrics", headers=as_["root"]).status_code == 200
        assert "purple" in str(http.get("/api/v1/memory/blocks?user=default", headers=as_["root"]).json())
        assert studio.batch in [b["id"] for b in http.get("/api/v1/batches", headers=as_["default"]).json()]

        # a gallery login of one's own
        users.set_password(settings, "bob", "a long enough password")
        page = http.get("/", auth=("bob", "a long enough password"))
        assert page.status_code == 200 and not any(mark in page.text for mark in A_MARKS)
        assert http.get("/", auth=("bob", "a wrong password here")).status_code == 401

        # revoked and expired keys are refused
        assert users.revoke(settings, "bob") == 1
        assert http.get("/api/v1/batches", headers=as_["bob"]).status_code == 401
        assert http.get("/", auth=("bob", "a long enough password")).status_code == 401
        later = users.new_key(settings, "bob")
        assert http.get("/api/v1/batches", headers={"Authorization": f"Bearer {later}"}).status_code == 200
        with session_scope(settings) as s:
            s.execute(sa.text("update api_keys set expires_at = now() - interval '1 second' where revoked_at is null"))
        assert http.get("/api/v1/batches", headers={"Authorization": f"Bearer {later}"}).status_code == 401
        assert http.get("/api/v1/batches").status_code == 401  # with users, no credential is no one
    finally:
        with session_scope(settings) as s:
            s.execute(sa.text("delete from users"))
