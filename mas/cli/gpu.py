"""`mas gpu plan`: which in-process settings fit a card, from the memory plan (no GPU, no models needed)."""

from __future__ import annotations

from dataclasses import replace

import click
from rich.table import Table

from mas.cli.context import console
from mas.config import Settings
from mas.gpu_rules import vram_plan


@click.group()
def gpu() -> None:
    """The GPU worker's in-process models: their memory plan."""


@gpu.command()
@click.option(
    "--vram-gb",
    type=click.FloatRange(1, 4096),
    default=None,
    help="The card's memory in GiB (default MAS_VRAM_BUDGET_GB, else 24: the seed's RTX 3090).",
)
@click.option(
    "--stages",
    type=click.Choice(["1", "2"]),
    default=None,
    help="One stage, or two (latent upsample x2 and refine); default: two when MAS_DIFFUSERS_UPSAMPLER_PATH is set.",
)
@click.pass_obj
def plan(settings: Settings, vram_gb: float | None, stages: str | None) -> None:
    """Which weight storage, offload and VAE tiling settings fit VRAM_GB for the configured render (size, frames,
    dtype, guidance) and DQA grading, and each phase's peak under the configured settings."""
    budget = vram_gb or settings.gpu.vram_budget_gb or 24.0
    recipe = replace(vram_plan.recipe_of(settings), dqa=True)  # a gpu worker may grade with DQA too
    if stages is not None:
        recipe = replace(recipe, two_stage=stages == "2")
    out_w, out_h = recipe.out_size
    console.print(
        f"{recipe.width}x{recipe.height}, {recipe.frames} frames -> {out_w}x{out_h}; guidance {recipe.guidance:g}; "
        f"compute {recipe.dtype}; budget {budget:g} GiB (peak = weights on the device + activations + "
        f"{vram_plan.RESERVE_BYTES / vram_plan.GIB:g} GiB reserve)"
    )
    table = Table("weights", "offload", "vae tiling", "peak GiB", "at", "fits", title="settings")
    for option in vram_plan.variants(recipe):
        worst = vram_plan.peak(option)
        fits = worst.peak_bytes <= budget * vram_plan.GIB
        table.add_row(
            "fp8" if option.fp8 else option.dtype,
            option.offload,
            "yes" if option.vae_tiling else "no",
            f"{worst.peak_bytes / vram_plan.GIB:.1f}",
            worst.name,
            "yes" if fits else "no",
        )
    console.print(table)
    best = vram_plan.recommend(recipe, budget)
    if best is None:
        console.print(
            f"nothing fits {budget:g} GiB: a smaller render (MAS_VIDEO_WIDTH, MAS_VIDEO_HEIGHT, MAS_VIDEO_FRAMES) "
            "or one stage"
        )
    else:
        weights = "fp8" if best.fp8 else best.dtype
        tiling = ", vae tiling" if best.vae_tiling else ""
        console.print(
            f"recommended: {weights}, offload {best.offload}{tiling} ({vram_plan.settings_of(best)}), the least "
            "offloading that fits, bf16 before fp8, untiled before tiled"
        )
    detail = Table("phase", "models", "weights GiB", "activations GiB", "peak GiB", "estimate", title=recipe.describe())
    for phase in vram_plan.phases(recipe):
        detail.add_row(
            phase.name,
            ", ".join(phase.models) or "-",
            f"{phase.weights_bytes / vram_plan.GIB:.2f}",
            f"{phase.activation_bytes / vram_plan.GIB:.2f}",
            f"{phase.peak_bytes / vram_plan.GIB:.2f}",
            phase.note,
        )
    console.print(detail)
    console.print(
        "weights: real-size models on the meta device (mas/vram_models.json, sources in gpu/configs/); render "
        "activations: shape counts fitted to a GPU run (bench/RESULTS-ltx2-memory.md)"
    )


COMMANDS = [gpu]
