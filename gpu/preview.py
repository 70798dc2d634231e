"""The `preview` renderer and grader: offline stand-ins for LTX-2 and DQA, and they say so.

The renderer writes a real short H.264 mp4 of animated colour cards in the prompt's palette. It responds
to the prompt the way a weak video model responds to a vague one: without "sharp focus" the frames are
noisy, without "steady camera" the motion jitters, without "dominant colours" the palette is washed out.
The grader measures those three properties on the decoded frames (noise, frame-to-frame change, distance
to the requested palette) and grades their mean by `mas.gpu_rules.grading`'s table, as DQA does. Neither is a video
model or a quality model; they exist so the whole pipeline, refinement loop included, runs on a machine
with no GPU.
"""

from __future__ import annotations

import itertools
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import imageio_ffmpeg
import numpy as np

from gpu.interfaces import STOP_POLL_SECONDS, Progress, check_stop
from mas import grades
from mas.domain.identity import Actor
from mas.palette import palette_of
from mas.video import decode_video

NAME = "preview"


@dataclass(frozen=True, kw_only=True)
class PreviewRenderer:
    name: str = NAME
    uses_this_gpu: bool = True  # a stand-in for a model on this GPU: it takes a GPU turn as one would
    last_run_seconds: float | None = None
    width: int = 192
    height: int = 112
    frames: int = 24
    fps: int = 12
    seconds: float = 0.0  # simulated render time, spread over the frames (a fixed-duration generator)

    def __call__(
        self,
        *,
        prompt: str,
        negative_prompt: str,  # noqa: ARG002
        seed: int,
        output: Path,
        render_id: str,  # noqa: ARG002
        progress: Progress | None = None,
        should_stop: Callable[[], bool] | None = None,
        order: float | None = None,  # noqa: ARG002
    ) -> Path:
        """Render `prompt` to `output` (written to a temporary name next to it, then renamed: never half a
        file). `render_id` is not needed: a render in process ends with its worker, so there is no earlier
        render to find again."""
        rng = np.random.default_rng(seed)
        text = prompt.lower()
        noise = 8.0 if "sharp focus" in text else 45.0
        jitter = 1 if "steady camera" in text else 10
        vivid = 1.0 if "dominant colours" in text else 0.45
        palette = np.array(palette_of(prompt), dtype=np.float32)
        grey = np.full(3, 128, dtype=np.float32)
        colours = vivid * palette + (1 - vivid) * grey
        band = self.width // len(colours) + 1
        ramp = 18 * np.sin(np.linspace(0, 6 * np.pi, self.width))[:, None]
        base = np.repeat(colours, band, axis=0)[: self.width] + ramp
        card = np.broadcast_to(base, (self.height, self.width, 3))
        output.parent.mkdir(parents=True, exist_ok=True)
        fd, partial = tempfile.mkstemp(dir=output.parent, prefix=f".{output.name}.", suffix=".partial.mp4")
        os.close(fd)
        try:
            writer = imageio_ffmpeg.write_frames(
                partial,
                (self.width, self.height),
                fps=self.fps,
                codec="libx264",
                output_params=["-metadata", "comment=mas preview render (offline stand-in, not a video model)"],
                macro_block_size=16,
                ffmpeg_log_level="error",
            )
            writer.send(None)
            try:
                for i in range(self.frames):
                    shift = i * 2 + int(rng.integers(-jitter, jitter + 1))
                    frame = np.roll(card, shift, axis=1) + rng.normal(0, noise, card.shape)
                    writer.send(np.clip(frame, 0, 255).astype(np.uint8).tobytes())
                    _pause(self.seconds / self.frames, should_stop)
                    if progress is not None:
                        progress(i + 1, self.frames)
            finally:
                writer.close()
            os.replace(partial, output)
        finally:
            Path(partial).unlink(missing_ok=True)
        return output


def _pause(seconds: float, should_stop: Callable[[], bool] | None) -> None:
    """Sleep `seconds` (the simulated render time of a frame), asking `should_stop` as often as promised."""
    wake = time.monotonic() + seconds
    while True:
        check_stop(should_stop, "the preview render")
        if (left := wake - time.monotonic()) <= 0:
            return
        time.sleep(min(left, STOP_POLL_SECONDS))


@dataclass(frozen=True, kw_only=True)
class PreviewGrader:
    """Scores sharpness, smoothness and palette adherence of a video in [0, 1] and grades their mean."""

    name: str = NAME

    def __call__(
        self,
        *,
        video: Path,
        prompt: str,
        actor: Actor,  # noqa: ARG002
        concept: str = "",  # noqa: ARG002
    ) -> tuple[dict[str, float], str]:
        frames = decode_video(video).astype(np.float32)
        # noise: mean absolute difference between horizontally adjacent pixels inside colour bands
        detail = np.abs(np.diff(frames, axis=1)).mean()
        sharpness = float(np.clip(1 - (detail - 2) / 30, 0, 1))
        # smoothness: the pan measured between consecutive frames, against a steady 2-pixel pan
        profiles = frames.mean(axis=(1, 3))
        shifts = [
            min(range(-16, 17), key=lambda d: np.abs(np.roll(a, d) - b).mean()) for a, b in itertools.pairwise(profiles)
        ]
        smoothness = float(np.clip(1 - np.mean(np.abs(np.array(shifts) - 2)) / 6, 0, 1))
        # palette: mean distance of the average band colour to the nearest requested colour
        palette = np.array(palette_of(prompt), dtype=np.float32)
        columns = frames.mean(axis=(0, 1))
        dist = np.min(np.linalg.norm(columns[:, None, :] - palette[None, :, :], axis=2), axis=1).mean()
        adherence = float(np.clip(1 - dist / 90, 0, 1))
        scores = {"sharpness": round(sharpness, 4), "smoothness": round(smoothness, 4), "palette": round(adherence, 4)}
        total = float(np.mean(list(scores.values())))
        scores["total"] = round(total, 4)
        return scores, grades.of_total(total)
