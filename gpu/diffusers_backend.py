"""The `diffusers` video backend: LTX-2 (or LTX-Video) run in the GPU worker through diffusers.

The pipeline is loaded once per worker process through the residency manager and stays on the device
between tasks; a backend object is cheap and built per task. Frames come back as floats in [0, 1] and are
written as H.264 with imageio-ffmpeg. LTX-2 generates sound with the picture: `LTX2Pipeline` returns
`audio`, a waveform tensor (batch, channels, samples) in [-1, 1] at `vocoder.config.output_sampling_rate`
(24 kHz for LTX-2), which is muxed into the mp4 as AAC. LTX-Video returns frames only.

What stays on the device (fp8 storage, offload mode, VAE tiling) and the two-stage recipe are in
`gpu.ltx2_recipe`; `mas.gpu_rules.vram_plan` says which settings fit a card.
"""

from __future__ import annotations

import os
import tempfile
import wave
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import imageio_ffmpeg
import numpy as np
import torch

from gpu.interfaces import Progress, check_stop
from gpu.ltx2_recipe import REFINE_ADAPTER, LTX2Stages, sampling, store_fp8, two_stage
from gpu.residency import Residency
from mas.config import Settings
from mas.errors import PermanentError

NAME = "diffusers"
PIPELINES = {"ltx2": "LTX2Pipeline", "ltx": "LTXPipeline"}
"""MAS_DIFFUSERS_PIPELINE -> the diffusers pipeline class that loads the model folder."""


class ModelPathError(PermanentError, FileNotFoundError):
    """MAS_DIFFUSERS_MODEL_PATH is unset or does not name a diffusers pipeline folder."""


def model_folder(settings: Settings) -> Path:
    """The configured pipeline folder, checked: a worker should fail on its first task, not mid-render."""
    path = settings.diffusers.model_path
    hint = "set MAS_DIFFUSERS_MODEL_PATH to a local LTX-2 diffusers folder"
    if path is None:
        raise ModelPathError(f"the diffusers backend has no model: {hint}")
    if not (path / "model_index.json").is_file():
        raise ModelPathError(f"{path} is not a diffusers pipeline folder (no model_index.json): {hint}")
    return path


@dataclass(frozen=True, kw_only=True)
class DiffusersBackend:
    """Renders with the diffusers pipeline named by the settings, kept resident by `residency`."""

    settings: Settings
    residency: Residency
    name: str = NAME
    uses_this_gpu: bool = True
    last_run_seconds: float | None = None

    def __post_init__(self) -> None:
        model_folder(self.settings)

    @property
    def key(self) -> str:
        """The residency key: one resident pipeline per model folder, class, storage, offload and recipe."""
        s = self.settings
        recipe = f"{s.diffusers.fp8}:{s.diffusers.offload_mode}:{s.diffusers.vae_tiling}:{s.diffusers.upsampler_path}:{s.diffusers.lora_path}"
        return f"diffusers:{s.diffusers.pipeline}:{s.gpu.torch_dtype}:{s.diffusers.model_path}:{recipe}"

    @property
    def two_stage(self) -> bool:
        return self.settings.diffusers.pipeline == "ltx2" and self.settings.diffusers.upsampler_path is not None

    def pipeline(self) -> LTX2Stages:
        """The resident pipeline, loaded on first need (in the worker child, never at import)."""
        return self.residency.get(self.key, loader=self._load, offload=self.settings.diffusers.offload_mode)

    def _load(self) -> LTX2Stages:
        import diffusers  # heavy; only the GPU worker needs it

        s = self.settings
        compute = getattr(torch, s.gpu.torch_dtype)
        pipeline_class = getattr(diffusers, PIPELINES[s.diffusers.pipeline])
        pipeline = pipeline_class.from_pretrained(model_folder(s), dtype=compute, local_files_only=True)
        pipeline.set_progress_bar_config(disable=True)  # progress goes to the task state instead
        stages = LTX2Stages(pipeline=pipeline, offload_mode=s.diffusers.offload_mode)
        if self.two_stage:
            from diffusers.pipelines.ltx2 import LTX2LatentUpsamplePipeline, LTX2LatentUpsamplerModel

            upsampler = LTX2LatentUpsamplerModel.from_pretrained(
                s.diffusers.upsampler_path, dtype=compute, local_files_only=True
            )
            stages.upsample = LTX2LatentUpsamplePipeline(vae=pipeline.vae, latent_upsampler=upsampler)
            stages.upsample.set_progress_bar_config(disable=True)
            if s.diffusers.lora_path is not None:
                lora = s.diffusers.lora_path
                pipeline.load_lora_weights(lora.parent, weight_name=lora.name, adapter_name=REFINE_ADAPTER)
                pipeline.disable_lora()  # on for the refining steps only
                stages.lora = True
        if s.diffusers.fp8:
            store_fp8([m for m in (pipeline.transformer, pipeline.text_encoder) if m is not None], compute)
        if s.diffusers.vae_tiling:
            pipeline.vae.enable_tiling()
        stages.place(self.residency.device)
        return stages

    def __call__(
        self,
        *,
        prompt: str,
        negative_prompt: str,
        seed: int,
        output: Path,
        render_id: str,  # noqa: ARG002
        progress: Progress | None = None,
        should_stop: Callable[[], bool] | None = None,
        order: float | None = None,  # noqa: ARG002
    ) -> Path:
        """Render `prompt` to `output` (written to temporary names next to it, then renamed: never half a
        file). `should_stop` is asked before the pipeline starts, after every denoising step and before
        the video is written: a step runs to its end, and the pipeline stays resident. `render_id` is not
        needed: a render in process ends with its worker, so there is no earlier render to find again."""
        s = self.settings
        what = "the diffusers render"
        check_stop(should_stop, what)
        stages = self.pipeline()

        def on_step(done: int, total: int) -> None:
            if progress is not None:
                progress(done, total)
            check_stop(should_stop, what)

        common: dict[str, Any] = {
            "prompt": prompt,
            "negative_prompt": negative_prompt,
            "width": s.video.width,
            "height": s.video.height,
            "num_frames": s.video.frames,
            "frame_rate": float(s.video.fps),
            # a CPU generator draws the same noise for a seed on any device
            "generator": torch.Generator(device="cpu").manual_seed(seed),
        }
        first = sampling(distilled=s.diffusers.distilled, steps=s.video.steps, guidance=s.video.guidance_scale)
        if self.two_stage:
            result = two_stage(stages, first=first, common=common, on_step=on_step)
        else:

            def on_step_end(pipe: Any, step: int, timestep: Any, callback_kwargs: dict) -> dict:  # noqa: ARG001
                on_step(step + 1, pipe.num_timesteps)
                return callback_kwargs

            result = stages.pipeline(**common, **first, output_type="np", callback_on_step_end=on_step_end)
        frames = (np.clip(result.frames[0], 0, 1) * 255).round().astype(np.uint8)
        audio = getattr(result, "audio", None)
        rate = stages.pipeline.vocoder.config.output_sampling_rate if audio is not None else 0
        check_stop(should_stop, what)
        write_mp4(frames=frames, fps=s.video.fps, output=output, audio=audio, audio_rate=rate)
        return output


def write_mp4(*, frames: np.ndarray, fps: int, output: Path, audio: torch.Tensor | None, audio_rate: int) -> None:
    """Write uint8 RGB `frames` (frames, height, width, 3), with the first item of `audio` when given."""
    output.parent.mkdir(parents=True, exist_ok=True)
    partial, sound = (_scratch(output, suffix) for suffix in (".partial.mp4", ".partial.wav"))
    try:
        if audio is not None:
            write_wav(waveform=audio[0], rate=audio_rate, path=sound)
        height, width = frames.shape[1:3]
        writer = imageio_ffmpeg.write_frames(
            str(partial),
            (width, height),
            fps=fps,
            codec="libx264",
            ffmpeg_log_level="error",
            audio_path=str(sound) if audio is not None else None,
            audio_codec="aac" if audio is not None else None,
        )
        writer.send(None)
        for frame in frames:
            writer.send(np.ascontiguousarray(frame).tobytes())
        writer.close()
        os.replace(partial, output)
    finally:
        partial.unlink(missing_ok=True)
        sound.unlink(missing_ok=True)


def _scratch(output: Path, suffix: str) -> Path:
    """A new empty file next to `output`, its name unique to this call."""
    fd, name = tempfile.mkstemp(dir=output.parent, prefix=f".{output.name}.", suffix=suffix)
    os.close(fd)
    return Path(name)


def write_wav(*, waveform: torch.Tensor, rate: int, path: Path) -> None:
    """Write a (channels, samples) waveform in [-1, 1] as 16-bit PCM."""
    samples = (waveform.float().clamp(-1, 1) * 32767).round().to(torch.int16).cpu().numpy()
    with wave.open(str(path), "wb") as out:
        out.setnchannels(samples.shape[0])
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(np.ascontiguousarray(samples.T).tobytes())
