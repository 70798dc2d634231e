"""Reading mp4 files back: one decoder and one error for everyone who looks inside a rendered video.

The render step reads the first frame back, the graders decode every frame, the gallery shrinks each frame
as it arrives. All of them go through `iter_frames`, so a missing, empty, corrupt or frameless file is
reported the same way wherever it is met: `VideoUnreadable`, whose message names the file and what is wrong.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import imageio_ffmpeg
import numpy as np

from mas.errors import PermanentError

REDO = "re-render it"
"""The advice every message ends with: the file will not get better by reading it again."""


class VideoUnreadable(PermanentError):
    """The file is missing, empty, corrupt or truncated, or holds no video frames."""


def iter_frames(path: Path) -> Iterator[np.ndarray]:
    """Each frame of `path` as uint8 RGB (height, width, 3), decoded as it is read, so a long video never
    has to sit whole in memory. Raises VideoUnreadable, at the first frame or wherever decoding breaks."""
    if not path.is_file():
        raise VideoUnreadable(f"{path} does not exist: the render wrote no file; {REDO}")
    if path.stat().st_size == 0:
        raise VideoUnreadable(f"{path} is empty (0 bytes): the render was cut off; {REDO}")
    reader = imageio_ffmpeg.read_frames(str(path))
    count = 0
    try:
        with _ffmpeg_errors(path):
            meta = next(reader, None)
            if meta is not None:
                width, height = meta["size"]
                for buffer in reader:
                    count += 1
                    yield np.frombuffer(buffer, dtype=np.uint8).reshape(height, width, 3)
    finally:
        reader.close()
    if not count:
        raise VideoUnreadable(f"{path} holds no video frames; {REDO}")


def decode_video(path: Path) -> np.ndarray:
    """Every frame of `path` as uint8 RGB (frames, height, width, 3)."""
    return np.stack(list(iter_frames(path)))


def check_video(path: Path) -> None:
    """Decode the first frame only: enough to know a file plays, without the cost of decoding it all."""
    frames = iter_frames(path)
    try:
        next(frames)
    finally:
        frames.close()  # type: ignore[attr-defined]  # iter_frames is a generator: it closes the decoder


@contextmanager
def _ffmpeg_errors(path: Path) -> Iterator[None]:
    """imageio-ffmpeg's errors for unreadable input, as VideoUnreadable with ffmpeg's reason."""
    try:
        yield
    except (OSError, RuntimeError) as exc:
        detail = _ffmpeg_reason(str(exc))
        if "does not contain any stream" in detail:
            raise VideoUnreadable(f"{path} holds no video frames (no video stream); {REDO}") from exc
        raise VideoUnreadable(
            f"{path} could not be decoded ({detail}): the file is corrupt or truncated; {REDO}"
        ) from exc


def _ffmpeg_reason(message: str) -> str:
    """The line of ffmpeg's error output that says what went wrong (its last lines repeat it more vaguely)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    telling = [line for line in lines if "Error opening input:" in line or "does not contain any stream" in line]
    return (telling or lines or ["unknown error"])[-1]
