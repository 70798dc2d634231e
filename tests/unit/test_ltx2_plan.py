"""The memory plan of the in-process GPU work: the real-size census, the figures it gives, `mas gpu plan` and
the gpu worker's refusal of a recipe its budget cannot hold. No weights: every real-size model is built on
the meta device."""

from __future__ import annotations

import argparse
import importlib
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from mas.cli import main
from mas.cli.context import console
from mas.config import Settings
from mas.gpu_rules import vram_plan
from mas.gpu_rules.vram_plan import FP8, GIB, DoesNotFit, Recipe

pytest.importorskip("diffusers")
census = pytest.importorskip("gpu.model_census")


def test_the_committed_table_is_what_the_real_size_models_measure():
    """Regenerate with `python -m gpu.model_census` when a config or the libraries change."""
    measured = census.table()
    stored = vram_plan.models()
    assert {k: v for k, v in measured.items() if k != "_about"} == {k: v for k, v in stored.items() if k != "_about"}


def test_each_model_names_the_source_of_its_config():
    for name, row in vram_plan.models().items():
        if name.startswith("_"):
            continue
        config = json.loads((census.CONFIGS.parent.parent / row["config"]).read_text())
        assert row["source"] == config["_source"] and len(row["source"]) > 40


def test_the_real_sizes():
    models = vram_plan.models()
    assert round(models["transformer"]["params"] / 1e9, 2) == 18.88  # "19B"
    assert round(models["text_encoder"]["params"] / 1e9, 2) == 12.19  # Gemma 3 12B, with its vision tower
    transformer = models["transformer"]
    assert transformer["bfloat16"]["bytes"] == 2 * transformer["params"]  # every weight in bf16: 35 GiB
    assert transformer["bfloat16"]["bytes"] > 24 * GIB  # no whole component fits a 3090 at bf16 ...
    assert 0.5 < transformer["fp8"]["bytes"] / transformer["bfloat16"]["bytes"] < 0.51  # norms stay in bf16
    assert models["text_encoder"]["fp8"]["bytes"] < 12.5 * GIB  # ... and fp8 roughly halves both
    leaf = {name: {k: models[name][k]["largest_leaf_bytes"] for k in ("fp8", "bfloat16")} for name in FP8}
    assert leaf["transformer"]["fp8"] * 2 == leaf["transformer"]["bfloat16"]
    assert leaf["text_encoder"]["fp8"] == leaf["text_encoder"]["bfloat16"]  # the token embedding stays in bf16


@pytest.mark.parametrize("mode", vram_plan.OFFLOAD_MODES)
def test_the_plan_counts_what_the_residency_manager_charges(mode):
    """The plan's arithmetic over the census and the residency's count over the loaded modules agree."""
    from gpu.sizes import device_bytes

    for fp8 in (False, True):
        transformer = census.build_meta("transformer").to(torch.bfloat16)
        if fp8:
            census.cast_fp8(transformer)
        recipe = Recipe(offload=mode, fp8=fp8)
        assert device_bytes([transformer], mode) == vram_plan.on_device("transformer", recipe)


def test_which_settings_fit_a_24_gb_card():
    """The two-stage 768x512x121 recipe, distilled (no guidance), graded with DQA."""
    fits = {r.describe(): vram_plan.peak(r).peak_bytes <= 24 * GIB for r in vram_plan.variants(Recipe())}
    assert not fits["bfloat16, offload none, two-stage"]
    assert not fits["bfloat16, offload model, vae tiling, two-stage"]  # the transformer alone is 35 GiB
    assert not fits["fp8, offload model, vae tiling, two-stage"]  # ran out in the refining steps on a GPU
    assert not fits["bfloat16, offload group, two-stage"]  # the untiled decode of 1536x1024x121
    assert fits["bfloat16, offload group, vae tiling, two-stage"]  # held a 24 GiB cap on a GPU
    best = vram_plan.recommend(Recipe(), 24)
    assert best is not None and best.describe() == "bfloat16, offload group, vae tiling, two-stage"
    assert vram_plan.settings_of(best) == "MAS_DIFFUSERS_FP8=false MAS_DIFFUSERS_OFFLOAD=group MAS_VAE_TILING=true"
    roomy = vram_plan.recommend(Recipe(), 80)
    assert roomy is not None and roomy.describe() == "bfloat16, offload none, vae tiling, two-stage"
    assert vram_plan.recommend(Recipe(), 4) is None


def test_the_plan_is_calibrated_to_the_recorded_gpu_run(monkeypatch):
    """bench/RESULTS-ltx2-memory.json, the plan column as its report writes it: at or above every phase that
    was measured, by at most 3.1 GiB (the prompt encoding under offloading, where the text encoder's largest
    weights and the connectors' activations are counted together; in fp8 the run also stored the token
    embedding in fp8), and a configuration that ran out of memory under its cap does not fit the plan."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench"))
    bench = importlib.import_module("ltx2_memory_bench")
    run = json.loads((Path(__file__).resolve().parents[2] / "bench" / "RESULTS-ltx2-memory.json").read_text())
    args = argparse.Namespace(**run["args"])
    measured = 0
    for name, result in run["results"].items():
        spec, plan = bench.CONFIGS[name], bench.planned(bench.CONFIGS[name], args)
        for phase, peak in result.get("peaks", {}).items():
            assert 0 <= plan[phase] - peak / GIB <= 3.1, (name, phase)
            measured += 1
        if result["result"].startswith("OOM"):
            assert spec["cap"] is not None
            recipe = Recipe(fp8=spec["fp8"], offload=spec["offload"], vae_tiling=spec["tiling"], dqa=False)
            assert vram_plan.peak(recipe).peak_bytes > spec["cap"] * GIB, name
    assert measured == 13


def test_each_phase_and_what_it_holds():
    recipe = Recipe(fp8=True, offload="model", vae_tiling=True)
    phases = {p.name: p for p in vram_plan.phases(recipe)}
    assert list(phases) == [
        "encode prompt", "denoise", "upsample latents", "refine", "decode",
        "verify (CLIP)", "benchmark", "preference", "tune (QLoRA DPO)",
    ]  # fmt: skip
    models = vram_plan.models()
    assert phases["denoise"].weights_bytes == models["transformer"]["fp8"]["bytes"]
    assert phases["refine"].activation_bytes > 2 * phases["denoise"].activation_bytes  # 4x the tokens
    assert phases["encode prompt"].weights_bytes == models["text_encoder"]["fp8"]["bytes"]
    assert phases["benchmark"].weights_bytes == 0
    one_stage = [p.name for p in vram_plan.phases(replace(recipe, two_stage=False, dqa=False))]
    assert one_stage == ["encode prompt", "denoise", "decode"]
    everything = sum(vram_plan.on_device(m, replace(recipe, offload="none")) for m in vram_plan.RENDER)
    assert vram_plan.peak(replace(recipe, offload="none")).weights_bytes == everything


def test_mas_gpu_plan_lists_what_fits(tmp_path, monkeypatch):
    monkeypatch.setenv("MAS_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(console, "width", 200)  # the console read its width once, wherever it was first imported
    result = CliRunner().invoke(main, ["gpu", "plan", "--vram-gb", "24", "--stages", "2"])
    assert result.exit_code == 0, result.output
    assert "768x512, 121 frames -> 1536x1024" in result.output
    rows = [line for line in result.output.splitlines() if line.startswith(("│ bfloat16 ", "│ fp8 "))]
    assert len(rows) == 16
    assert sum(line.rstrip(" │").endswith("yes") for line in rows) == 4  # group and sequential, with tiling
    said = " ".join(result.output.split())  # the console may wrap a long line anywhere
    assert "recommended: bfloat16, offload group, vae tiling (MAS_DIFFUSERS_FP8=false MAS_DIFFUSERS_OFFLOAD=group" in said
    assert "tune (QLoRA DPO)" in said


def test_the_gpu_worker_refuses_a_recipe_its_budget_cannot_hold(tmp_path, monkeypatch):
    monkeypatch.setenv("MAS_DATA_DIR", str(tmp_path))
    for key, value in {"MAS_VIDEO_BACKEND": "diffusers", "MAS_VRAM_BUDGET_GB": "24"}.items():
        monkeypatch.setenv(key, value)
    result = CliRunner().invoke(main, ["worker", "--queue", "gpu"])
    assert result.exit_code == 1
    line = result.output.strip()
    assert "\n" not in line
    assert line.startswith("Error: the in-process LTX-2 work (bfloat16, offload none, one-stage) needs ")
    assert "but the VRAM budget is 24 GiB; `mas gpu plan --vram-gb 24` lists the settings that fit" in line


def test_the_backend_is_refused_before_anything_loads_and_a_fitting_recipe_is_not(tmp_path):
    from gpu.diffusers_backend import ModelPathError
    from gpu.factory import video_backend

    too_big = Settings(data_dir=tmp_path, video_backend="diffusers", vram_budget_gb=24)
    with pytest.raises(DoesNotFit, match="needs [0-9.]+ GiB at its peak"):  # noqa: RUF043
        video_backend(too_big)
    fitting = too_big.model_copy(update={"diffusers_offload": "group", "vae_tiling": True, "grader": "dqa"})
    vram_plan.check_fits(fitting)
    with pytest.raises(ModelPathError):  # past the check, on to the model folder
        video_backend(fitting)
    assert Settings(cpu_offload=True).diffusers.offload_mode == "model"  # the older setting still means model offload
