"""How the in-process LTX-2 pipeline is stored, offloaded and run: fp8 weights, offload modes, the two stages.

LTX-2 does not fit a 24 GB card at bf16 in any one piece (its transformer alone is 35 GiB), so the backend
chooses, by settings, what stays on the device (`mas.gpu_rules.vram_plan` says which choices fit a card):

- fp8 storage (MAS_DIFFUSERS_FP8): diffusers' layerwise casting keeps the transformer's and text encoder's
  Linear, Conv and Embedding weights in float8_e4m3fn and upcasts each layer as it runs; norms stay as they are,
  and so does any layer that holds a buffer (Gemma's token embedding and the output head that shares its
  weight), see `fp8_skips`.
- offload (MAS_DIFFUSERS_OFFLOAD): `model` is diffusers' model CPU offload (one whole model on the device at a
  time); `group` and `sequential` are diffusers' group offloading at leaf level (each module brought on as it
  runs), `group` with the next module prefetched on a CUDA stream, `sequential` without. Both run on any
  device, so the CPU tests exercise them.
- the two-stage recipe (MAS_DIFFUSERS_UPSAMPLER_PATH): stage 1 at the configured size, the latents upsampled x2
  by `LTX2LatentUpsamplePipeline`, then 3 refining steps on the distilled stage-2 sigmas, with the distilled
  LoRA (MAS_DIFFUSERS_LORA_PATH) switched on for them only.

What a loaded pipeline keeps on the device under each mode is `gpu.sizes.device_bytes`, the same count
`mas.gpu_rules.vram_plan.on_device` makes from the census.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

REFINE_ADAPTER = "refine"
FP8 = torch.float8_e4m3fn


CAST_LAYERS: tuple[type[nn.Module], ...] = (nn.Linear, nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d)
CAST_LAYERS += (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
"""The layers diffusers' layerwise casting stores in fp8 (those its hook is applied to)."""


def fp8_skips(module: nn.Module) -> tuple[str, ...]:
    """diffusers' default skip patterns (norms, positional embeddings, patchify projections), and the layers that
    hold a buffer of their own or share a weight with one. The casting hook casts a whole layer, buffers
    included, to fp8 and back around each call with `Module.to`, which replaces each buffer by a new tensor:
    streamed group offloading keys its host copies by tensor, so the next onload fails (KeyError), and the
    buffer is rounded to fp8 (Gemma 3's embedding scale, the square root of its width: 61.97 stored as 64). In
    LTX-2 that is Gemma's token embedding and its tied output head; the transformer has none."""
    from diffusers.hooks.layerwise_casting import DEFAULT_SKIP_MODULES_PATTERN

    layers = {name: m for name, m in module.named_modules() if isinstance(m, CAST_LAYERS)}
    owners = [m for m in layers.values() if next(m.buffers(recurse=False), None) is not None]
    held = {id(p) for m in owners for p in m.parameters()}
    kept = [name for name, m in layers.items() if m in owners or any(id(p) in held for p in m.parameters())]
    return tuple(DEFAULT_SKIP_MODULES_PATTERN) + tuple(f"^{re.escape(name)}$" for name in kept)


def store_fp8(modules: list[nn.Module], compute: torch.dtype) -> None:
    """fp8 weight storage, upcast to `compute` layer by layer (diffusers' layerwise casting, but for the layers
    `fp8_skips` names, which keep their dtype)."""
    from diffusers.hooks import apply_layerwise_casting

    for module in modules:
        apply_layerwise_casting(
            module, storage_dtype=FP8, compute_dtype=compute, skip_modules_pattern=fp8_skips(module)
        )


def offload(modules: list[nn.Module], mode: str, device: torch.device) -> None:
    """Leaf-level group offloading of `modules` onto `device` (group: with CUDA-stream prefetch)."""
    from diffusers.hooks import apply_group_offloading

    stream = mode == "group" and device.type == "cuda"
    for module in modules:
        apply_group_offloading(module, onload_device=device, offload_type="leaf_level", use_stream=stream)


@dataclass(kw_only=True)
class LTX2Stages:
    """The loaded pipeline, and for the two-stage recipe its latent upsampler: one thing the residency holds."""

    pipeline: Any
    upsample: Any = None  # LTX2LatentUpsamplePipeline sharing the pipeline's VAE
    lora: bool = False
    offload_mode: str = "none"

    @property
    def components(self) -> dict[str, Any]:
        found = dict(self.pipeline.components)
        if self.upsample is not None:
            found["latent_upsampler"] = self.upsample.latent_upsampler
        return found

    @property
    def modules(self) -> list[nn.Module]:
        return [m for m in self.components.values() if isinstance(m, nn.Module)]

    def to(self, device: Any) -> LTX2Stages:
        self.pipeline.to(device)
        if self.upsample is not None:
            self.upsample.latent_upsampler.to(device)
        return self

    def place(self, device: torch.device) -> None:
        """Put the models where the offload mode wants them (the residency never moves an offloaded pipeline)."""
        if self.offload_mode == "model":
            self.pipeline.enable_model_cpu_offload(device=device)
            if self.upsample is not None:
                self.upsample.enable_model_cpu_offload(device=device)
        elif self.offload_mode in ("group", "sequential"):
            offload(self.modules, self.offload_mode, device)


def sampling(*, distilled: bool, steps: int, guidance: float) -> dict[str, Any]:
    """Stage 1's schedule: the distilled checkpoint's 8 fixed sigmas without guidance, else the settings'."""
    if distilled:
        from diffusers.pipelines.ltx2.utils import DISTILLED_SIGMA_VALUES

        sigmas = list(DISTILLED_SIGMA_VALUES)
        return {"sigmas": sigmas, "num_inference_steps": len(sigmas), "guidance_scale": 1.0}
    return {"num_inference_steps": steps, "guidance_scale": guidance}


@contextmanager
def refining(stages: LTX2Stages) -> Iterator[list[float]]:
    """Stage 2's setting for the time of its steps: the distilled LoRA on, a scheduler without dynamic
    shifting; yields its sigmas. Both are put back after, so the next render's stage 1 is untouched."""
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.ltx2.utils import STAGE_2_DISTILLED_SIGMA_VALUES

    pipeline = stages.pipeline
    scheduler = pipeline.scheduler
    pipeline.scheduler = FlowMatchEulerDiscreteScheduler.from_config(
        scheduler.config, use_dynamic_shifting=False, shift_terminal=None
    )
    if stages.lora:
        pipeline.enable_lora()
    try:
        yield list(STAGE_2_DISTILLED_SIGMA_VALUES)
    finally:
        pipeline.scheduler = scheduler
        if stages.lora:
            pipeline.disable_lora()


def two_stage(
    stages: LTX2Stages,
    *,
    first: dict[str, Any],
    common: dict[str, Any],
    on_step: Callable[[int, int], None],
) -> Any:
    """Stage 1 to latents, x2 latent upsample, stage 2 to frames and sound. `on_step(done, total)` after each
    denoising step of either stage."""
    from diffusers.pipelines.ltx2.utils import STAGE_2_DISTILLED_SIGMA_VALUES

    common = dict(common)  # the caller's arguments stay as they were
    width, height = common.pop("width"), common.pop("height")
    first_steps = first["num_inference_steps"]
    total = first_steps + len(STAGE_2_DISTILLED_SIGMA_VALUES)

    def step_callback(offset: int) -> Callable[..., dict]:
        def callback(pipe: Any, step: int, timestep: Any, kwargs: dict) -> dict:  # noqa: ARG001
            on_step(offset + step + 1, total)
            return kwargs

        return callback

    pipeline = stages.pipeline
    prompt, negative = common.pop("prompt"), common.pop("negative_prompt")
    embeds, mask, negative_embeds, negative_mask = pipeline.encode_prompt(
        prompt, negative, do_classifier_free_guidance=first["guidance_scale"] > 1
    )  # once for both stages: with offloading, the text encoder is brought on once
    video, audio = pipeline(
        **common,
        **first,
        prompt_embeds=embeds,
        prompt_attention_mask=mask,
        negative_prompt_embeds=negative_embeds,
        negative_prompt_attention_mask=negative_mask,
        width=width,
        height=height,
        output_type="latent",
        return_dict=False,
        callback_on_step_end=step_callback(0),
    )
    upsampled = stages.upsample(
        latents=video,
        width=width,
        height=height,
        num_frames=common["num_frames"],
        output_type="latent",
        return_dict=False,
    )[0]
    with refining(stages) as sigmas:
        return pipeline(
            **common,
            prompt_embeds=embeds,
            prompt_attention_mask=mask,
            latents=upsampled,
            audio_latents=audio,
            width=2 * width,
            height=2 * height,
            sigmas=sigmas,
            num_inference_steps=len(sigmas),
            noise_scale=sigmas[0],
            guidance_scale=1.0,
            output_type="np",
            callback_on_step_end=step_callback(first_steps),
        )
