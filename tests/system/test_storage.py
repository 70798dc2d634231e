"""Where finished videos live: the output folder, or a bucket on a real S3-compatible server (SeaweedFS,
started by the test); and the partial files of dead renders removed on the host where they lie."""

from __future__ import annotations

import os
import socket

import pytest

from mas import db
from mas.config import Settings
from mas.storage import StorageRefused, local_copy, storage, video_key
from tests.harness import s3_server
from tests.harness.s3_server import S3Server
from tests.parts import need


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    try:
        server = S3Server(tmp_path_factory.mktemp("s3"))
        server.__enter__()
    except RuntimeError as exc:
        need("S3", f"no S3-compatible server: {exc}")
    yield server
    server.__exit__(None, None, None)


def test_videos_in_a_bucket_are_read_on_a_host_that_never_had_them(s3, tmp_path):
    """The gpu host puts; another host (another data folder, so an empty cache) reads the same location."""
    gpu_host = Settings(data_dir=tmp_path / "gpu", **_s3_settings(s3, "studio-a"))
    other_host = Settings(data_dir=tmp_path / "cpu", **_s3_settings(s3, "studio-a"))
    key = video_key(batch_id=7, video_id=8, attempt=1)
    staged = storage(gpu_host).staging(key)
    staged.write_bytes(os.urandom(3000))
    data = staged.read_bytes()
    location = storage(gpu_host).put(staged, key)
    assert location == f"s3://{s3.bucket}/studio-a/{key}"
    assert f"studio-a/{key}" in s3.keys()  # noqa: SIM118  # the bucket's keys, not a dict
    assert storage(other_host).exists(key) and not storage(other_host).exists("batch-7/nothing.mp4")
    assert not (tmp_path / "cpu").exists()  # asking copied nothing here
    copy = local_copy(other_host, location)
    assert copy is not None and copy.read_bytes() == data and copy.is_relative_to(tmp_path / "cpu")
    assert local_copy(other_host, f"s3://{s3.bucket}/studio-a/batch-7/nothing.mp4") is None  # never stored
    assert local_copy(other_host, f"s3://{s3.bucket}/elsewhere/{key}") is None  # not this storage's
    assert local_copy(other_host, "/etc/passwd") is None


def test_a_bucket_that_refuses_the_keys_is_a_setting_to_fix_not_a_retry(s3, tmp_path):
    settings = Settings(data_dir=tmp_path, **{**_s3_settings(s3, "x"), "s3_secret_access_key": "wrong"})
    staged = storage(settings).staging("batch-1/video-1-attempt-1.mp4")
    staged.write_bytes(b"x")
    with pytest.raises(StorageRefused) as refused:
        storage(settings).put(staged, "batch-1/video-1-attempt-1.mp4")
    assert not refused.value.retryable and "wrong" not in str(refused.value)


def test_the_s3_server_starts_on_another_block_when_a_port_of_its_own_is_taken_at_its_start(s3, tmp_path, monkeypatch):
    """Its ports are probed free, then bound by SeaweedFS: under pytest -n another process may bind one in
    between. The harness starts it again on another block instead of failing the test that needs it."""
    del s3  # only its skip: a machine without SeaweedFS skips here too
    probe = s3_server.free_port_block
    taken: list[socket.socket] = []

    def a_block_whose_master_port_is_taken(address: str, size: int, twins: int) -> int:
        base = probe(address, size, twins=twins)
        if not taken:
            holder = socket.socket()
            holder.bind((address, base + 2))  # the master's port
            holder.listen()
            taken.append(holder)
        return base

    monkeypatch.setattr(s3_server, "free_port_block", a_block_whose_master_port_is_taken)
    try:
        with S3Server(tmp_path / "s3") as server:
            assert server.client().head_bucket(Bucket=server.bucket)
            starts = [log.read_text() for log in (tmp_path / "s3").glob("weed-*.log")]
            assert len(starts) == 2, starts
            assert any("Port allocation failed" in log for log in starts), starts
    finally:
        for holder in taken:
            holder.close()


def _s3_settings(s3: S3Server, prefix: str) -> dict:
    return {
        "storage_url": f"s3://{s3.bucket}/{prefix}",
        "s3_endpoint_url": s3.endpoint,
        "s3_access_key_id": s3.access_key,
        "s3_secret_access_key": s3.secret_key,
    }


def test_partial_files_of_renders_no_live_lease_runs_are_removed(clean):
    """A killed render's scratch file carries its lease's key; the live render's is kept."""
    from gpu.maintenance import remove_partial_renders
    from mas.pipeline import leases
    from tests.rows import one_video

    with db.session_scope(clean) as session:
        vid = one_video(session).id
    live = leases.claim(clean, video_id=vid, attempt=1, step="render", worker="gpu@test")
    assert live is not None
    folder = clean.videos_dir / "batch-1"
    folder.mkdir(parents=True, exist_ok=True)
    running = folder / f"video-{vid}-attempt-1.{live.key}.partial.mp4"
    dead = folder / f"video-{vid}-attempt-1.{'0' * 12}.partial.mp4"
    inner = folder / f".video-{vid}-attempt-1.{'1' * 12}.partial.mp4.abc.partial.wav"  # a backend's own scratch
    for path in (running, dead, inner):
        path.write_bytes(b"partial")
    assert remove_partial_renders(clean) == 2
    assert running.exists() and not dead.exists() and not inner.exists()
    leases.release(clean, live)  # the render ended; had it been killed, its lease would have expired
    assert remove_partial_renders(clean) == 1 and not running.exists()
