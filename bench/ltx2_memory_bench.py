"""LTX-2 at its real size on a GPU, random weights: each phase's peak memory and seconds per step, against the plan.

Builds the real-size LTX-2 pipeline (19B transformer, Gemma 3 12B text encoder, connectors, VAEs, vocoder, x2
latent upsampler; configs from gpu/configs/) with random weights initialised on the GPU (no weights needed, no
hub), runs one 768x512x121 render through the studio's own two-stage recipe (`gpu.ltx2_recipe`: stage 1 on the
distilled sigmas without guidance, latent upsample x2, the 3 refining steps, decode), and records for each phase
torch.cuda.max_memory_allocated and for each stage the seconds per denoising step. Configurations that model
the seed's RTX 3090 run with the process capped to 24 GiB of the card (torch.cuda.set_per_process_memory_fraction).
Each configuration runs in its own process, so an out-of-memory or a timeout is a result, not the end of the
run; a global time budget skips what would not finish. The plan's prediction (`mas.gpu_rules.vram_plan`) is written
beside each measurement. `--tiny` runs the same code on tiny models on the CPU in seconds (a smoke test).

    python bench/ltx2_memory_bench.py --output bench/RESULTS-ltx2-memory.md
    python bench/ltx2_memory_bench.py --tiny
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import ROOT, command_line, machine

GIB = 2**30
CONFIGS: dict[str, dict[str, Any]] = {
    # name -> weights storage, offload mode, VAE tiling, memory cap (GiB; None: the whole card); in run order
    "3090: fp8, model offload, tiling": {"fp8": True, "offload": "model", "tiling": True, "cap": 24},
    "3090: bf16, model offload, tiling": {"fp8": False, "offload": "model", "tiling": True, "cap": 24},
    "whole card: bf16, no offload, tiling": {"fp8": False, "offload": "none", "tiling": True, "cap": None},
    "3090: fp8, group offload, tiling": {"fp8": True, "offload": "group", "tiling": True, "cap": 24},
    "3090: bf16, group offload, tiling": {"fp8": False, "offload": "group", "tiling": True, "cap": 24},
    "whole card: fp8, no offload, tiling": {"fp8": True, "offload": "none", "tiling": True, "cap": None},
}
TINY = {  # the same architectures, a few channels wide
    "transformer": {
        "in_channels": 4,
        "out_channels": 4,
        "num_attention_heads": 2,
        "attention_head_dim": 8,
        "cross_attention_dim": 16,
        "audio_in_channels": 4,
        "audio_out_channels": 4,
        "audio_num_attention_heads": 2,
        "audio_attention_head_dim": 4,
        "audio_cross_attention_dim": 8,
        "num_layers": 2,
        "caption_channels": 32,
        "rope_double_precision": False,
    },
    "connectors": {
        "caption_channels": 32,
        "text_proj_in_factor": 3,
        "video_connector_num_attention_heads": 4,
        "video_connector_attention_head_dim": 8,
        "video_connector_num_layers": 1,
        "video_connector_num_learnable_registers": None,
        "audio_connector_num_attention_heads": 4,
        "audio_connector_attention_head_dim": 8,
        "audio_connector_num_layers": 1,
        "audio_connector_num_learnable_registers": None,
        "connector_rope_base_seq_len": 32,
        "rope_double_precision": False,
    },
    "vae": {
        "latent_channels": 4,
        "block_out_channels": [8],
        "decoder_block_out_channels": [8],
        "layers_per_block": [1],
        "decoder_layers_per_block": [1, 1],
        "spatio_temporal_scaling": [True],
        "decoder_spatio_temporal_scaling": [True],
        "decoder_inject_noise": [False, False],
        "downsample_type": ["spatial"],
        "upsample_residual": [False],
        "upsample_factor": [1],
        "down_block_types": ["LTX2VideoDownBlock3D"],
        "patch_size": 1,
        "spatial_compression_ratio": None,
        "temporal_compression_ratio": None,
    },
    "audio_vae": {"base_channels": 4, "ch_mult": [1], "num_res_blocks": 1, "resolution": 32, "latent_channels": 2, "mel_bins": 8},
    "vocoder": {
        "in_channels": 16,
        "hidden_channels": 32,
        "upsample_kernel_sizes": [4, 4],
        "upsample_factors": [2, 2],
        "resnet_kernel_sizes": [3],
        "resnet_dilations": [[1, 3, 5]],
        "output_sampling_rate": 16000,
    },
    "latent_upsampler": {"in_channels": 4, "mid_channels": 32, "num_blocks_per_stage": 1},
    "text_encoder": {
        "text_config": {
            "hidden_size": 32,
            "intermediate_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 8,
            "vocab_size": 64,
            "sliding_window": 16,
        },
        "vision_config": {
            "hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 8, "patch_size": 4
        },
        "mm_tokens_per_image": 4,
    },
}


def build(name: str, *, tiny: bool, device: Any, dtype: Any) -> Any:
    """One component, its weights initialised where it is built (the GPU: seconds for 19B parameters)."""
    import torch

    from gpu import model_census

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device), torch.no_grad():
            return model_census.instantiate(name, TINY.get(name) if tiny else None).requires_grad_(False)
    finally:
        torch.set_default_dtype(previous)


def tokenizer() -> Any:
    """A character tokenizer: prompts are padded to the pipeline's 1024 tokens whatever the vocabulary."""
    import string

    import transformers

    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "▁"]
    return transformers.GemmaTokenizer(vocab={t: i for i, t in enumerate(specials + list(string.printable[:58]))})


class PhaseMeter:
    """Marks phase changes from the components' forward calls; the peak of each phase, written to `path` as each
    phase ends (so a configuration cut off by the time budget still reports the phases it finished)."""

    def __init__(self, cuda: bool, path: Path, partial: dict[str, Any]) -> None:
        self.cuda, self.current, self.peaks, self.stage = cuda, "", {}, 1
        self.path, self.partial = path, partial

    def enter(self, phase: str) -> None:
        import torch

        if phase == self.current:
            return
        self.close()
        self.current = phase
        self.write()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()

    def close(self) -> None:
        import torch

        if self.current and self.cuda:
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
            self.peaks[self.current] = max(self.peaks.get(self.current, 0), peak)
        self.write()

    def write(self) -> None:
        where = f"in {self.current}" if self.current else "before the render"
        self.path.write_text(json.dumps({**self.partial, "result": f"stopped {where}", "peaks": self.peaks}))

    def hook(self, module: Any, phase: str) -> None:
        module.register_forward_pre_hook(lambda *_: self.enter(phase if phase != "denoise" else self.denoise))

    @property
    def denoise(self) -> str:
        return "denoise" if self.stage == 1 else "refine"


def run_one(name: str, spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:  # noqa: ARG001
    """Build, place and render once under one configuration; what it measured."""
    import diffusers
    import torch
    from diffusers.pipelines.ltx2 import LTX2LatentUpsamplePipeline
    from diffusers.pipelines.ltx2.utils import DISTILLED_SIGMA_VALUES

    from gpu.ltx2_recipe import LTX2Stages, store_fp8, two_stage

    cuda = torch.cuda.is_available() and not args.tiny
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.float32 if args.tiny else torch.bfloat16
    started = time.monotonic()
    parts = {}
    for part in ("text_encoder", "connectors", "transformer", "vae", "audio_vae", "vocoder", "latent_upsampler"):
        parts[part] = build(part, tiny=args.tiny, device=device, dtype=dtype)
        if spec["fp8"] and part in ("transformer", "text_encoder"):
            store_fp8([parts[part]], dtype)
        if spec["offload"] != "none":
            parts[part].to("cpu")  # built on the GPU (fast), kept on the host (the offload modes bring it on)
    build_seconds = time.monotonic() - started
    if cuda:
        torch.cuda.empty_cache()
        if spec["cap"]:
            torch.cuda.set_per_process_memory_fraction(
                spec["cap"] * GIB / torch.cuda.get_device_properties(0).total_memory
            )
    upsampler = parts.pop("latent_upsampler")
    pipeline = diffusers.LTX2Pipeline(
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), tokenizer=tokenizer(), **parts
    )
    pipeline.set_progress_bar_config(disable=True)
    stages = LTX2Stages(pipeline=pipeline, offload_mode=spec["offload"])
    stages.upsample = LTX2LatentUpsamplePipeline(vae=pipeline.vae, latent_upsampler=upsampler)
    stages.upsample.set_progress_bar_config(disable=True)
    if spec["tiling"]:
        pipeline.vae.enable_tiling()
    card = torch.cuda.get_device_name(0) if cuda else "none (CPU)"
    partial = {"card": card, "build_seconds": round(build_seconds, 1)}
    meter = PhaseMeter(cuda, Path(args.result), partial)
    meter.close()
    for part, phase in (
        ("text_encoder", "encode prompt"),
        ("connectors", "encode prompt"),
        ("transformer", "denoise"),
        ("audio_vae", "decode"),
        ("vocoder", "decode"),
    ):
        meter.hook(getattr(pipeline, part), phase)

    def upsampling(*_: Any) -> None:
        meter.enter("upsample latents")
        meter.stage = 2

    upsampler.register_forward_pre_hook(upsampling)
    decode = pipeline.vae.decode
    pipeline.vae.decode = lambda *a, **k: (meter.enter("decode"), decode(*a, **k))[1]
    if spec["offload"] == "none":
        stages.to(device)
    else:
        stages.place(device)
    steps: list[tuple[int, float]] = []

    def on_step(done: int, total: int) -> None:  # noqa: ARG001
        if cuda:
            torch.cuda.synchronize()
        steps.append((done, time.monotonic()))

    size = (64, 64, 9) if args.tiny else (args.width, args.height, args.frames)
    first = {
        "sigmas": list(DISTILLED_SIGMA_VALUES[: args.steps]),
        "num_inference_steps": args.steps,
        "guidance_scale": 1.0,
    }
    common = {
        "prompt": "a red fox runs through snow at dawn",
        "negative_prompt": "",
        "width": size[0],
        "height": size[1],
        "num_frames": size[2],
        "frame_rate": 24.0,
        "generator": torch.Generator().manual_seed(0),
    }
    render_started = time.monotonic()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    result = two_stage(stages, first=first, common=common, on_step=on_step)
    meter.close()
    frames = result.frames[0]
    times = [t for _, t in steps]
    first_steps = [b - a for a, b in itertools.pairwise(times)]  # the first step warms up
    refine_steps = [b - a for a, b in zip(times[args.steps :], times[args.steps + 1 :])]
    return {
        **partial,
        "result": "ok",
        "frames": list(frames.shape),
        "audio": list(result.audio.shape),
        "peaks": meter.peaks,
        "overall_peak": torch.cuda.max_memory_allocated() if cuda else 0,
        "stage1_seconds_per_step": sorted(first_steps)[len(first_steps) // 2] if first_steps else None,
        "stage2_seconds_per_step": sorted(refine_steps)[len(refine_steps) // 2] if refine_steps else None,
        "render_seconds": round(time.monotonic() - render_started, 1),
    }


def child(args: argparse.Namespace) -> None:
    spec = CONFIGS[args.one]
    try:
        out = run_one(args.one, spec, args)
    except Exception as exc:  # an out-of-memory is a result
        import torch

        text = Path(args.result).read_text()
        partial = json.loads(text) if text else {}
        oom = isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()
        where = partial.get("result", "stopped while building").removeprefix("stopped ")
        out = {
            **partial,
            "result": f"OOM {where}" if oom else f"error {where}: {type(exc).__name__}",
            "detail": (str(exc).splitlines() or [""])[0][:300],
        }
        if torch.cuda.is_available():
            out["overall_peak"] = torch.cuda.max_memory_allocated()
    Path(args.result).write_text(json.dumps(out))


def planned(spec: dict[str, Any], args: argparse.Namespace) -> dict[str, float]:
    """The plan's prediction per phase, in GiB, without its fixed reserve (which no tensor counts); none where
    the studio's own dependencies are not installed (a bare GPU host: `--report-from` writes it again here)."""
    try:
        from mas.gpu_rules import vram_plan
    except ImportError:
        return {}

    recipe = vram_plan.Recipe(
        width=args.width,
        height=args.height,
        frames=args.frames,
        guidance=1.0,
        fp8=spec["fp8"],
        offload=spec["offload"],
        vae_tiling=spec["tiling"],
        dqa=False,
    )
    return {p.name: (p.weights_bytes + p.activation_bytes) / GIB for p in vram_plan.render_phases(recipe)}


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace, gpu: str, command: str, host: str) -> str:
    lines = [
        "# LTX-2 in process at its real size: memory and step time",
        "",
        "Command:",
        "",
        f"    {command}",
        "",
        f"Date: {datetime.date.today()}. Machine: {host}. Card: {gpu}.",
        f"Render: {args.width}x{args.height}, {args.frames} frames, two stages (stage 1 on the first {args.steps} "
        "distilled sigmas, no guidance; latent upsample x2; the 3 refining steps; decode at twice the size). Random "
        "weights at the real sizes (gpu/configs/). Peaks are torch.cuda.max_memory_allocated per phase (the CUDA "
        "context is not in them); `plan` is mas.gpu_rules.vram_plan's weights + activations for the phase.",
        "",
        "| configuration | result | s/step stage 1 | s/step stage 2 | build s | render s |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        s1, s2 = r.get("stage1_seconds_per_step"), r.get("stage2_seconds_per_step")
        result = r["result"] + (f" ({r['detail']})" if r.get("detail") else "")
        lines.append(
            f"| {name} | {result} | {s1 and f'{s1:.2f}'} | {s2 and f'{s2:.2f}'} | "
            f"{r.get('build_seconds', '')} | {r.get('render_seconds', '')} |"
        )
    lines += ["", "Peak per phase, GiB (measured / plan):", ""]
    phases = ["encode prompt", "denoise", "upsample latents", "refine", "decode"]
    lines += ["| configuration | cap | " + " | ".join(phases) + " | overall |", "|---" * (len(phases) + 3) + "|"]
    for name, r in results.items():
        plan = planned(CONFIGS[name], args)
        peaks = r.get("peaks", {})
        cells = [
            f"{f'{peaks[p] / GIB:.1f}' if p in peaks else '-'} / {f'{plan[p]:.1f}' if p in plan else '?'}"
            for p in phases
        ]
        cap = CONFIGS[name]["cap"]
        # the meter resets the peak at each phase: the run's is the largest of the phases' and the last's
        figures = [*peaks.values(), *([r["overall_peak"]] if r.get("overall_peak") else [])]
        overall = max(figures, default=0) / GIB
        measured = cap and r["result"] == "ok" and figures
        held = "" if not measured else (" (cap held)" if overall <= cap else " (over the cap!)")
        shown = f"{overall:.1f}" if figures else "-"
        lines.append(f"| {name} | {cap or 'none'} | " + " | ".join(cells) + f" | {shown}{held} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=None, help="Markdown report (default: print it).")
    parser.add_argument("--tiny", action="store_true", help="Tiny models on the CPU: a smoke test in seconds.")
    parser.add_argument("--budget", type=float, default=360, help="Seconds for the whole run (default %(default)s).")
    parser.add_argument("--steps", type=int, default=3, help="Stage-1 steps timed (of the 8 distilled).")
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--height", type=int, default=512)
    parser.add_argument("--frames", type=int, default=121)
    parser.add_argument(
        "--configs",
        default=",".join(str(i) for i in range(len(CONFIGS))),
        help="Which configurations, by index in run order (default all).",
    )
    parser.add_argument(
        "--report-from", type=Path, default=None, help="Write the report again from a run's .json (no GPU needed)."
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        return child(args)
    if args.report_from:
        saved = json.loads(args.report_from.read_text())
        vars(args).update(saved["args"])
        text = report(saved["results"], args, saved["card"], saved["command"], saved["machine"])
        return write(text, args.output)
    deadline = time.monotonic() + args.budget
    names = [list(CONFIGS)[int(i)] for i in args.configs.split(",")]
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        left = deadline - time.monotonic()
        if left < 30:
            results[name] = {"result": "skipped (time budget)"}
            continue
        print(f"[{args.budget - left:5.0f} s] {name} ...", flush=True)
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            argv = [
                sys.executable,
                __file__,
                "--one",
                name,
                "--result",
                out.name,
                "--steps",
                str(args.steps),
                "--width",
                str(args.width),
                "--height",
                str(args.height),
                "--frames",
                str(args.frames),
            ]
            try:
                subprocess.run(argv + (["--tiny"] if args.tiny else []), timeout=left, check=False, cwd=ROOT)
                text = Path(out.name).read_text()
                results[name] = json.loads(text) if text else {"result": "crashed (no result)"}
            except subprocess.TimeoutExpired:  # what it finished is in its file
                text = Path(out.name).read_text()
                results[name] = {**(json.loads(text) if text else {}), "result": f"timed out after {left:.0f} s"}
        r = results[name]
        print(
            f"        {r['result']} peak {max([r.get('overall_peak', 0), *r.get('peaks', {}).values()]) / GIB:.1f} GiB "
            f"s/step {r.get('stage1_seconds_per_step')} / {r.get('stage2_seconds_per_step')}",
            flush=True,
        )
    cards = [r["card"] for r in results.values() if r.get("card")]  # the parent never holds a CUDA context
    card, command, host = cards[0] if cards else "unknown", command_line(__file__), machine()
    if args.output:  # the report goes to bench/ whatever folder the GPU host wrote it to
        command = command.replace(str(args.output), f"bench/{args.output.name}")
    if args.output:  # the raw figures beside the report, to write it again elsewhere (--report-from)
        kept = {k: vars(args)[k] for k in ("width", "height", "frames", "steps")}
        raw = {"args": kept, "results": results, "card": card, "command": command, "machine": host}
        args.output.with_suffix(".json").write_text(json.dumps(raw, indent=2) + "\n")
    write(report(results, args, card, command, host), args.output)


def write(text: str, output: Path | None) -> None:
    if output:
        output.write_text(text)
        print(f"wrote {output}")
    else:
        print(text)


if __name__ == "__main__":
    main()
