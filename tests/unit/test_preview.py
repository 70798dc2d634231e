"""The preview renderer: an mp4 at the path asked for and nothing else, and a stop request honoured."""

from __future__ import annotations

import time

import pytest

from gpu.interfaces import RenderStopped
from gpu.preview import PreviewRenderer


def test_a_render_leaves_only_its_mp4(tmp_path):
    output = tmp_path / "video.mp4"
    steps: list[int] = []
    renderer = PreviewRenderer(frames=4)
    assert renderer(prompt="a red fox", negative_prompt="", seed=1, output=output, render_id="r",
                    progress=lambda done, total: steps.append(done)) == output  # noqa: ARG005
    assert output.read_bytes()[4:8] == b"ftyp" and steps == [1, 2, 3, 4]
    assert list(tmp_path.iterdir()) == [output]


def test_should_stop_ends_a_slow_render_promptly_and_leaves_no_file(tmp_path):
    renderer = PreviewRenderer(frames=4, seconds=30.0)  # 7.5 s a frame
    started = time.monotonic()
    with pytest.raises(RenderStopped, match="the preview render was stopped on request"):
        renderer(prompt="a red fox", negative_prompt="", seed=1, output=tmp_path / "video.mp4", render_id="r",
                 should_stop=lambda: time.monotonic() - started > 0.3)
    assert time.monotonic() - started < 1.5  # asked during the frame's wait, not only between frames
    assert list(tmp_path.iterdir()) == []
