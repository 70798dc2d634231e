"""The output folder as the videos' storage: keys map to files under it and nothing outside it. Pure code over
a temporary folder."""

from __future__ import annotations

from pathlib import Path

from mas.storage import FolderStorage, video_key


def test_the_folder_storage_keeps_videos_under_its_folder_and_nothing_outside_it(tmp_path):
    store = FolderStorage(tmp_path / "videos")
    render = tmp_path / "render.mp4"
    render.write_bytes(b"x" * 2000)
    key = video_key(batch_id=1, video_id=2, attempt=3)
    location = store.put(render, key)
    assert Path(location) == tmp_path / "videos" / "batch-1" / "video-2-attempt-3.mp4" and not render.exists()
    assert store.key_of(location) == key and store.local_file(key) == Path(location)
    (tmp_path / "outside.mp4").write_bytes(b"secret")
    (tmp_path / "videos" / "link.mp4").symlink_to(tmp_path / "outside.mp4")
    for refused in ("../outside.mp4", "/etc/passwd", "batch-1/../../outside.mp4", "link.mp4", "", "batch-1/"):
        assert store.local_file(refused) is None, refused
    assert store.key_of(str(tmp_path / "outside.mp4")) is None
    assert store.local_file("batch-1/missing.mp4") is None
