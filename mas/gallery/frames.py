"""Frame strips: a few frames of a video side by side in one JPEG, extracted on request and cached.

One image per video keeps a gallery page to one extra request per card. The video is decoded once and
each frame is shrunk as it arrives, so a long full-resolution render never sits whole in memory (a
121-frame 768x512 LTX-2 clip is ~140 MB of raw RGB); only the few thumbnails asked for are kept.
"""

from __future__ import annotations

import io
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image

from mas.video import iter_frames

STRIP_FRAMES = 6
FRAME_HEIGHT = 96
GAP = 4


def strip_jpeg(path: Path) -> bytes:
    """The strip of `path` as JPEG bytes, from the cache unless the file changed since."""
    stat = path.stat()
    return _strip(str(path), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=256)
def _strip(path: str, mtime_ns: int, size: int) -> bytes:  # noqa: ARG001
    """Keyed by modification time and size as well as path, so a file rewritten in place is never stale."""
    thumbs = _thumbnails(path)
    picks = np.linspace(0, len(thumbs) - 1, min(STRIP_FRAMES, len(thumbs))).round().astype(int)
    chosen = [thumbs[i] for i in picks]
    strip = Image.new("RGB", (sum(t.width for t in chosen) + GAP * (len(chosen) - 1), FRAME_HEIGHT), "black")
    x = 0
    for thumb in chosen:
        strip.paste(thumb, (x, 0))
        x += thumb.width + GAP
    out = io.BytesIO()
    strip.save(out, format="JPEG", quality=82)
    return out.getvalue()


def _thumbnails(path: str) -> list[Image.Image]:
    """Every frame shrunk to FRAME_HEIGHT as it is decoded; VideoUnreadable if the file is not a video."""
    thumbs = []
    for frame in iter_frames(Path(path)):
        height, width = frame.shape[:2]
        size = (max(1, round(width * FRAME_HEIGHT / height)), FRAME_HEIGHT)
        thumbs.append(Image.fromarray(frame).resize(size, Image.Resampling.BILINEAR))
    return thumbs
