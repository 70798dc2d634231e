"""The in-process models at their real size, built on the meta device: what their weights take, no weights needed.

Each model is built from its real architecture config (`gpu/configs/*.json`, each naming its source) on
torch's meta device, so a 19B transformer costs no memory and a second of CPU. It is then measured at each
storage dtype: bfloat16 (or float16: the same bytes), float32, and fp8 storage as the backend's layerwise
casting leaves it (Linear, Conv and Embedding weights in float8_e4m3fn; norms, the other modules matching
diffusers' default skip patterns and the layers that hold buffers in the compute dtype: `gpu.ltx2_recipe`).
`python -m gpu.model_census` writes the table `mas.gpu_rules.vram_plan` reads (`mas/gpu_rules/vram_models.json`): the plan is
arithmetic over it, so the CLI needs neither torch nor these models.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gpu.ltx2_recipe import store_fp8
from gpu.sizes import module_bytes, own_bytes

CONFIGS = Path(__file__).parent / "configs"
TABLE = Path(__file__).resolve().parent.parent / "mas" / "gpu_rules" / "vram_models.json"
LORA_RANK = 16
"""The Tuner's LoRA rank (`gpu.tuner.TunerConfig.lora_r`): the census counts its adapter at this rank."""

FP8_COMPONENTS = ("transformer", "text_encoder")
"""What MAS_DIFFUSERS_FP8 stores in fp8: the two models that are most of LTX-2's bytes."""


def config(name: str) -> dict[str, Any]:
    """A real architecture config, without its provenance keys."""
    return {k: v for k, v in json.loads((CONFIGS / f"{name}.json").read_text()).items() if not k.startswith("_")}


def source(name: str) -> str:
    return str(json.loads((CONFIGS / f"{name}.json").read_text())["_source"])


def _ltx2(cls_name: str) -> Callable[[dict[str, Any]], nn.Module]:
    def build(cfg: dict[str, Any]) -> nn.Module:
        import diffusers
        from diffusers.pipelines import ltx2
        from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

        cls = getattr(diffusers, cls_name, None) or getattr(ltx2, cls_name, None) or LTX2Vocoder
        return cls(**cfg)

    return build


def _gemma3(cfg: dict[str, Any]) -> nn.Module:
    import transformers

    return transformers.Gemma3ForConditionalGeneration(transformers.Gemma3Config(**cfg))


def _clip(cfg: dict[str, Any]) -> nn.Module:
    import transformers

    return transformers.CLIPModel(transformers.CLIPConfig(**cfg))


def _qwen(cfg: dict[str, Any]) -> nn.Module:
    import transformers

    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**cfg))


MODELS: dict[str, tuple[str, Callable[[dict[str, Any]], nn.Module]]] = {
    # plan name -> (config file, builder)
    "transformer": ("ltx2_transformer", _ltx2("LTX2VideoTransformer3DModel")),
    "text_encoder": ("gemma3_12b", _gemma3),
    "connectors": ("ltx2_connectors", _ltx2("LTX2TextConnectors")),
    "vae": ("ltx2_video_vae", _ltx2("AutoencoderKLLTX2Video")),
    "audio_vae": ("ltx2_audio_vae", _ltx2("AutoencoderKLLTX2Audio")),
    "vocoder": ("ltx2_vocoder", _ltx2("LTX2Vocoder")),
    "latent_upsampler": ("ltx2_latent_upsampler", _ltx2("LTX2LatentUpsamplerModel")),
    "clip": ("clip_vit_large_patch14", _clip),
    "preference_base": ("qwen2_5_1_5b_instruct", _qwen),
}


def instantiate(name: str, overrides: dict[str, Any] | None = None) -> nn.Module:
    """The model `name` from its real config, with `overrides` merged in (one level into nested configs), on
    whatever device and default dtype are current: meta here, the GPU in the memory bench."""
    cfg = config(MODELS[name][0])
    for key, value in (overrides or {}).items():
        cfg[key] = {**cfg[key], **value} if isinstance(value, dict) and isinstance(cfg.get(key), dict) else value
    return MODELS[name][1](cfg).eval()


def build_meta(name: str) -> nn.Module:
    """The model `name` at its real size, every tensor on the meta device."""
    with torch.device("meta"):
        return instantiate(name)


def cast_fp8(module: nn.Module, compute: torch.dtype = torch.bfloat16) -> nn.Module:
    """fp8 storage as the backend applies it (`gpu.ltx2_recipe.store_fp8`), for diffusers and transformers
    models alike."""
    module.to(compute)
    store_fp8([module], compute)
    return module


def measure(module: nn.Module) -> dict[str, int]:
    """Total bytes, the largest single module's own bytes (what leaf-wise offloading brings on at once), and
    the largest block of a ModuleList (what block-wise offloading brings on)."""
    blocks = [m for m in module.modules() if isinstance(m, nn.ModuleList)]
    largest_block = max((module_bytes(b) for lst in blocks for b in lst), default=0)
    return {
        "bytes": module_bytes(module),
        "largest_leaf_bytes": max(own_bytes(m) for m in module.modules()),
        "largest_block_bytes": largest_block,
    }


def lora_params(module: nn.Module, rank: int = LORA_RANK) -> tuple[int, int]:
    """(LoRA parameters at `rank` on every Linear but the output head, parameters of those Linears): what
    peft's 'all-linear' adapts, and what QLoRA stores in 4 bits."""
    adapted = frozen = 0
    for name, m in module.named_modules():
        if isinstance(m, nn.Linear) and not name.endswith("lm_head"):
            adapted += rank * (m.in_features + m.out_features)
            frozen += m.weight.numel()
    return adapted, frozen


def census(name: str) -> dict[str, Any]:
    """One model's row of the table."""
    file, _ = MODELS[name]
    row: dict[str, Any] = {"config": f"gpu/configs/{file}.json", "source": source(file)}
    row["params"] = sum(p.numel() for p in build_meta(name).parameters())
    row["float32"] = measure(build_meta(name).to(torch.float32))
    row["bfloat16"] = measure(build_meta(name).to(torch.bfloat16))
    if name in FP8_COMPONENTS:
        row["fp8"] = measure(cast_fp8(build_meta(name)))
    if name == "preference_base":
        row["lora_params"], row["linear_params"] = lora_params(build_meta(name))
    return row


def table() -> dict[str, Any]:
    import diffusers
    import transformers

    return {
        "_about": "written by `python -m gpu.model_census`: real-size models built on the meta device "
        f"(diffusers {diffusers.__version__}, transformers {transformers.__version__}); do not edit by hand",
        **{name: census(name) for name in MODELS},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=TABLE, help="Where the table goes (default: %(default)s).")
    args = parser.parse_args()
    from diffusers.utils import logging

    logging.set_verbosity_error()  # "modules that should be kept in float32": none here, and no weights
    args.output.write_text(json.dumps(table(), indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
