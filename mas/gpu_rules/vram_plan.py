"""The memory plan of the in-process GPU work: which settings fit a VRAM budget, before any model is loaded.

Weights are measured, not guessed: `vram_models.json` holds the bytes of every in-process model at its real
size (LTX-2's transformer, Gemma 3 12B text encoder, connectors, VAEs, vocoder and latent upsampler; the DQA
CLIP verifier and the preference model's base), written by `python -m gpu.model_census` from real-size models
built on the meta device from their published configs (each row names its source). Activations are counted
from each phase's shapes (tokens x width, channels x frames x pixels); a render phase's count is scaled by a
multiple, and leaf-level offloading adds a fixed extra, both fitted to the H200 run recorded in
bench/RESULTS-ltx2-memory.md so that weights + activations are at or above each measured peak, by at most
3.1 GiB. A phase's peak is the weights on the device while it runs (under the offload mode) + its activations
+ a fixed runtime reserve. The DQA phases are shape counts alone.

Pure arithmetic, no torch: `mas gpu plan` and the gpu worker's start-up check both read it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

from mas.config import Settings
from mas.errors import InvalidSettings

GIB = 2**30
TABLE = Path(__file__).with_name("vram_models.json")
OFFLOAD_MODES = ("none", "model", "group", "sequential")
"""none: every model stays on the device; model: one whole model at a time (diffusers' model CPU offload);
group: leaf modules brought on as they run, the next one prefetched (diffusers' group offloading); sequential:
one leaf module at a time, no prefetch (the same leaf-level group offloading without a stream)."""

RESERVE_BYTES = GIB
"""CUDA context, cuBLAS workspaces and allocator fragmentation: memory the card loses that no tensor counts."""
ELEMENT = {"bfloat16": 2, "float16": 2, "float32": 4}
RENDER = ("text_encoder", "connectors", "transformer", "latent_upsampler", "vae", "audio_vae", "vocoder")
FP8 = ("transformer", "text_encoder")  # what MAS_DIFFUSERS_FP8 stores in fp8 (as gpu.model_census measures)

# live tensors of a phase, in units of its widest tensor (the shape counts the multiples below scale)
TRANSFORMER_LIVE = 12  # hidden, norm, q, k, v, attention out, residual, FFN in (x4 counted below) ...
VAE_LIVE = 4  # input, output and the norm / activation temporaries of one conv block at full resolution
ACTIVATION_MULTIPLE = {"encode prompt": 8.0, "denoise": 3.1, "upsample latents": 1.6, "refine": 2.6, "decode": 1.6}
"""A render phase's activations over its shape count, rounded up: measured with whole models on the card at
bf16, where the weights on the device are known exactly and the rest of the peak is activations."""
LEAF_OFFLOAD_EXTRA = GIB // 2
"""What leaf-level offloading (group, sequential) holds beyond the leaves `on_device` counts: the parameters
and buffers above the leaves, brought on with them, and copies in flight."""
CLIP_BATCH, CLIP_TOKENS, CLIP_LIVE = 64, 257, 12
PREFERENCE_BATCH, PREFERENCE_TOKENS = 16, 256  # gpu.preference_model: 16 items of at most 256 tokens
TUNER_SEQUENCES, TUNER_TOKENS = 16, 256  # gpu.tuner: 8 pairs (chosen + rejected) of at most 256 tokens
NF4_BYTES = 0.5 + 4 / 64  # QLoRA's 4-bit weights with one float32 scale per 64


@cache
def models() -> dict[str, Any]:
    """The census of real-size models (`gpu.model_census`)."""
    return dict(json.loads(TABLE.read_text()))


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """What the plan needs to know of a render and the grading after it."""

    width: int = 768
    height: int = 512
    frames: int = 121
    fps: int = 24
    two_stage: bool = True
    guidance: float = 1.0  # > 1 runs each step on the prompt and the negative prompt (a batch of 2)
    dtype: str = "bfloat16"
    fp8: bool = False
    offload: str = "none"
    vae_tiling: bool = False
    prompt_tokens: int = 1024  # LTX2Pipeline's max_sequence_length: prompts are padded to it
    dqa: bool = True

    @property
    def out_size(self) -> tuple[int, int]:
        scale = 2 if self.two_stage else 1
        return self.width * scale, self.height * scale

    def describe(self) -> str:
        weights = "fp8" if self.fp8 else self.dtype
        stages = "two-stage" if self.two_stage else "one-stage"
        tiling = ", vae tiling" if self.vae_tiling else ""
        return f"{weights}, offload {self.offload}{tiling}, {stages}"


def recipe_of(settings: Settings) -> Recipe:
    return Recipe(
        width=settings.video.width,
        height=settings.video.height,
        frames=settings.video.frames,
        fps=settings.video.fps,
        two_stage=settings.diffusers.upsampler_path is not None,
        guidance=1.0 if settings.diffusers.distilled else settings.video.guidance_scale,
        dtype=settings.gpu.torch_dtype,
        fp8=settings.diffusers.fp8,
        offload=settings.diffusers.offload_mode,
        vae_tiling=settings.diffusers.vae_tiling,
        dqa=settings.quality.grader == "dqa",
    )


def weights(name: str, recipe: Recipe, *, key: str = "bytes") -> int:
    """Bytes of model `name` (or of its largest leaf / block) as the recipe stores it."""
    row = models()[name]
    storage = "fp8" if recipe.fp8 and name in FP8 else recipe.dtype
    if storage == "float16":
        storage = "bfloat16"
    return int(row[storage][key])


def on_device(name: str, recipe: Recipe) -> int:
    """What model `name` holds on the device while it runs, under the recipe's offload mode; the same
    accounting `gpu.residency` charges a loaded pipeline."""
    if recipe.offload == "group":  # the running leaf and the prefetched next one
        return 2 * weights(name, recipe, key="largest_leaf_bytes")
    if recipe.offload == "sequential":
        return weights(name, recipe, key="largest_leaf_bytes")
    return weights(name, recipe)


@dataclass(frozen=True, kw_only=True)
class Phase:
    """One step of the GPU work and its peak on the device."""

    name: str
    models: tuple[str, ...]
    weights_bytes: int
    activation_bytes: int
    note: str

    @property
    def peak_bytes(self) -> int:
        return self.weights_bytes + self.activation_bytes + RESERVE_BYTES


def _latent(recipe: Recipe, scale: int) -> tuple[int, int, int]:
    return (recipe.frames - 1) // 8 + 1, recipe.height * scale // 32, recipe.width * scale // 32


def _denoise_activations(recipe: Recipe, *, scale: int, batch: int) -> int:
    e = ELEMENT[recipe.dtype]
    f, h, w = _latent(recipe, scale)
    video, audio = f * h * w, round(recipe.frames / recipe.fps * 25)  # audio latents: 16 kHz / 160 / 4
    width_v, width_a = 4096, 2048  # 32 heads x 128, 32 heads x 64 (ltx2_transformer.json)
    live = batch * (video * width_v + audio * width_a) * TRANSFORMER_LIVE * e
    rope = batch * video * width_v * 2 * 4  # cos and sin tables in float32
    return live + rope


def _decode_activations(recipe: Recipe) -> int:
    e = ELEMENT[recipe.dtype]
    width, height = recipe.out_size
    frames = recipe.frames
    if recipe.vae_tiling:  # diffusers' LTX-2 VAE tiles: 512 x 512 pixels, 16 frames
        width, height, frames = min(width, 512), min(height, 512), min(frames, 16)
    blocks = VAE_LIVE * 256 * frames * (height // 4) * (width // 4) * e  # 256 channels at 1/4 size
    out_w, out_h = recipe.out_size
    video = 3 * recipe.frames * out_w * out_h * (e + 4)  # the decoded video, and its float32 copy for numpy
    return blocks + video


def render_phases(recipe: Recipe) -> list[Phase]:
    """The phases of one render, each with what is on the device while it runs."""
    e = ELEMENT[recipe.dtype]
    batch = 2 if recipe.guidance > 1 else 1
    kept = batch * recipe.prompt_tokens * 3840 * 49 * e  # Gemma's 48 layers + embeddings, kept for both stages
    f, h, w = _latent(recipe, 1)
    phases = [
        ("encode prompt", ("text_encoder", "connectors"), 2 * kept, "every hidden state of Gemma, and a copy"),
        ("denoise", ("transformer",), kept + _denoise_activations(recipe, scale=1, batch=batch), "one step"),
    ]
    if recipe.two_stage:
        upsample = kept + 4 * 1024 * f * 2 * h * 2 * w * e
        refine = kept + _denoise_activations(recipe, scale=2, batch=1)
        phases += [
            ("upsample latents", ("latent_upsampler",), upsample, "1024 channels at twice the size"),
            ("refine", ("transformer",), refine, "one step, x2 latents"),
        ]
    decode = kept + _decode_activations(recipe)
    phases.append(("decode", ("vae", "audio_vae", "vocoder"), decode, "video and sound"))
    everything = sum(on_device(m, recipe) for m in RENDER if recipe.two_stage or m != "latent_upsampler")
    upcast = models()["transformer"]["bfloat16"]["largest_leaf_bytes"] if recipe.fp8 else 0  # a layer out of fp8
    extra = LEAF_OFFLOAD_EXTRA if recipe.offload in ("group", "sequential") else 0
    return [
        Phase(
            name=name,
            models=names,
            weights_bytes=everything if recipe.offload == "none" else max(on_device(m, recipe) for m in names),
            activation_bytes=round(ACTIVATION_MULTIPLE[name] * counted)
            + extra
            + (upcast if "transformer" in names else 0),
            note=note,
        )
        for name, names, counted, note in phases
    ]


def dqa_phases(recipe: Recipe) -> list[Phase]:
    """Grading and tuning: each model whole on the device (the residency manager evicts the render's)."""
    e = ELEMENT[recipe.dtype]
    width, height = recipe.out_size
    frames = recipe.frames * width * height * 3  # the decoded video, uint8, on the device
    base = models()["preference_base"]
    vocab, layers, hidden = 151936, 28, 1536  # qwen2_5_1_5b_instruct.json
    logits = PREFERENCE_BATCH * PREFERENCE_TOKENS * vocab * 4
    lora = base["lora_params"] * 16  # float32 weight, gradient and two AdamW moments
    nf4 = base["linear_params"] * NF4_BYTES + (base["params"] - base["linear_params"]) * 2
    checkpoints = TUNER_SEQUENCES * TUNER_TOKENS * hidden * 2 * (layers + 4)
    tuner_logits = TUNER_SEQUENCES * TUNER_TOKENS * vocab * 4 * 2
    return [
        Phase(
            name="verify (CLIP)",
            models=("clip",),
            weights_bytes=weights("clip", replace(recipe, fp8=False)),
            activation_bytes=frames + CLIP_BATCH * CLIP_TOKENS * 1024 * CLIP_LIVE * e,
            note="frames on the device, 64 crops at once",
        ),
        Phase(
            name="benchmark",
            models=(),
            weights_bytes=0,
            activation_bytes=frames + 16 * 3 * width * height * 4,
            note="no model: frames, 16 at a time in float32",
        ),
        Phase(
            name="preference",
            models=("preference_base",),
            weights_bytes=int(base["float32"]["bytes"]),
            activation_bytes=2 * logits,
            note="float32 base (gpu.preference_model) and its logits",
        ),
        Phase(
            name="tune (QLoRA DPO)",
            models=("preference_base",),
            weights_bytes=int(nf4 + lora),
            activation_bytes=checkpoints + tuner_logits,
            note="4-bit base, LoRA r=16 with AdamW, checkpointed layers, logits",
        ),
    ]


def phases(recipe: Recipe) -> list[Phase]:
    return render_phases(recipe) + (dqa_phases(recipe) if recipe.dqa else [])


def peak(recipe: Recipe) -> Phase:
    """The phase with the highest peak."""
    return max(phases(recipe), key=lambda p: p.peak_bytes)


def variants(base: Recipe) -> Iterator[Recipe]:
    """Every storage, offload and tiling choice for the same render."""
    for fp8 in (False, True):
        for offload in OFFLOAD_MODES:
            for tiling in (False, True):
                yield replace(base, fp8=fp8, offload=offload, vae_tiling=tiling)


def rank(recipe: Recipe) -> tuple[int, bool, bool]:
    """The order `recommend` prefers: the fewest weights moved per step first (none, whole models, leaves with
    the next prefetched, one leaf at a time), then bf16 before fp8 (fp8 rounds the weights and upcasts each
    layer as it runs), then whole decodes before tiled ones."""
    return OFFLOAD_MODES.index(recipe.offload), recipe.fp8, recipe.vae_tiling


def recommend(base: Recipe, budget_gb: float) -> Recipe | None:
    """The first variant of `base` by `rank` that fits `budget_gb`; None when none does."""
    fitting = [r for r in variants(base) if peak(r).peak_bytes <= budget_gb * GIB]
    return min(fitting, key=rank, default=None)


def settings_of(recipe: Recipe) -> str:
    """The settings that choose `recipe`'s storage, offload and tiling."""
    flag = {True: "true", False: "false"}
    return (
        f"MAS_DIFFUSERS_FP8={flag[recipe.fp8]} MAS_DIFFUSERS_OFFLOAD={recipe.offload} "
        f"MAS_VAE_TILING={flag[recipe.vae_tiling]}"
    )


class DoesNotFit(InvalidSettings):
    """The configured in-process work needs more memory than its VRAM budget at some phase."""


def check_fits(settings: Settings, *, budget_gb: float | None = None) -> None:
    """Refuse, in one line, an in-process LTX-2 configuration that cannot fit the budget (MAS_VRAM_BUDGET_GB
    unless given; no budget, no check)."""
    budget = settings.gpu.vram_budget_gb if budget_gb is None else budget_gb
    if settings.video.backend != "diffusers" or settings.diffusers.pipeline != "ltx2" or budget <= 0:
        return
    recipe = recipe_of(settings)
    worst = peak(recipe)
    if worst.peak_bytes > budget * GIB:
        raise DoesNotFit(
            f"the in-process LTX-2 work ({recipe.describe()}) needs {worst.peak_bytes / GIB:.1f} GiB at its "
            f"peak ({worst.name}) but the VRAM budget is {budget:g} GiB; `mas gpu plan --vram-gb {budget:g}` "
            "lists the settings that fit (MAS_DIFFUSERS_FP8, MAS_DIFFUSERS_OFFLOAD, MAS_VAE_TILING)"
        )
