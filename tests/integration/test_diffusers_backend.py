"""The diffusers backend, run for real on tiny random LTX-2 and LTX-Video pipelines built here.

No weights come from a hub: every component (Gemma 3 / T5 text encoder, tokenizer, transformer, VAEs,
vocoder) is built from a tiny config with a fixed seed and saved with `save_pretrained`, so the backend
loads a folder exactly as it loads a real model on a GPU host.
"""

from __future__ import annotations

import contextlib
import string
from pathlib import Path

import imageio_ffmpeg
import numpy as np
import pytest
import torch

from gpu.diffusers_backend import DiffusersBackend
from gpu.factory import residency, video_backend
from gpu.interfaces import RenderStopped
from gpu.residency import Residency
from gpu.sizes import module_bytes, own_bytes
from mas.config import Settings

diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")

FRAMES, STEPS, FPS, SIZE = 9, 2, 8, 32
CHARACTERS = list(string.ascii_lowercase + string.digits)


def build_tiny_ltx2(folder: Path) -> None:
    """A tiny LTX2Pipeline: Gemma 3 text encoder, audio-video transformer, video and audio VAEs, vocoder."""
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "▁"]
    tokenizer = transformers.GemmaTokenizer(vocab={t: i for i, t in enumerate(specials + CHARACTERS)})
    torch.manual_seed(0)
    text_encoder = transformers.Gemma3ForConditionalGeneration(
        transformers.Gemma3Config(
            text_config={
                "vocab_size": len(tokenizer), "hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 2,
                "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "sliding_window": 16,
            },
            vision_config={
                "hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 8,
                "patch_size": 4,
            },
            mm_tokens_per_image=4,
        )
    )
    text_width, text_layers = 32, 2 + 1  # hidden size; hidden states = layers + embeddings
    transformer = diffusers.LTX2VideoTransformer3DModel(
        in_channels=4, out_channels=4, patch_size=1, patch_size_t=1, num_attention_heads=2, attention_head_dim=8,
        cross_attention_dim=16, audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2,
        audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=2, qk_norm="rms_norm_across_heads",
        caption_channels=text_width, rope_double_precision=False, rope_type="split",
    )
    connectors = LTX2TextConnectors(  # connector width (heads x head dim) must equal the text width
        caption_channels=text_width, text_proj_in_factor=text_layers, video_connector_num_attention_heads=4,
        video_connector_attention_head_dim=8, video_connector_num_layers=1,
        video_connector_num_learnable_registers=None, audio_connector_num_attention_heads=4,
        audio_connector_attention_head_dim=8, audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=None, connector_rope_base_seq_len=32, rope_double_precision=False,
        rope_type="split",
    )
    vae = diffusers.AutoencoderKLLTX2Video(
        latent_channels=4, block_out_channels=(8,), decoder_block_out_channels=(8,), layers_per_block=(1,),
        decoder_layers_per_block=(1, 1), spatio_temporal_scaling=(True,), decoder_spatio_temporal_scaling=(True,),
        decoder_inject_noise=(False, False), downsample_type=("spatial",), upsample_residual=(False,),
        upsample_factor=(1,), timestep_conditioning=False, patch_size=1, patch_size_t=1,
    )
    audio_vae = diffusers.AutoencoderKLLTX2Audio(
        base_channels=4, output_channels=2, ch_mult=(1,), num_res_blocks=1, attn_resolutions=None, in_channels=2,
        resolution=32, latent_channels=2, norm_type="pixel", causality_axis="height", dropout=0.0,
        mid_block_add_attention=False, sample_rate=16000, mel_hop_length=160, is_causal=True, mel_bins=8,
    )
    vocoder = LTX2Vocoder(
        in_channels=2 * 8, hidden_channels=32, out_channels=2, upsample_kernel_sizes=[4, 4], upsample_factors=[2, 2],
        resnet_kernel_sizes=[3], resnet_dilations=[[1, 3, 5]], output_sampling_rate=16000,
    )
    diffusers.LTX2Pipeline(
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=vae, audio_vae=audio_vae,
        text_encoder=text_encoder, tokenizer=tokenizer, connectors=connectors, transformer=transformer,
        vocoder=vocoder,
    ).save_pretrained(folder)


def build_tiny_refiner(folder: Path, transformer_folder: Path) -> tuple[Path, Path]:
    """A tiny latent upsampler and a LoRA on the tiny LTX-2 transformer, as the two-stage recipe loads them."""
    from diffusers.pipelines.ltx2 import LTX2LatentUpsamplerModel
    from peft import LoraConfig, get_peft_model_state_dict

    torch.manual_seed(0)
    LTX2LatentUpsamplerModel(in_channels=4, mid_channels=32, num_blocks_per_stage=1, dims=3).save_pretrained(
        folder / "upsampler"
    )
    transformer = diffusers.LTX2VideoTransformer3DModel.from_pretrained(transformer_folder, subfolder="transformer")
    lora = LoraConfig(r=2, lora_alpha=2, target_modules=["to_q", "to_k", "to_v", "to_out.0"], init_lora_weights=False)
    transformer.add_adapter(lora)
    diffusers.LTX2Pipeline.save_lora_weights(
        folder / "lora", transformer_lora_layers=get_peft_model_state_dict(transformer), weight_name="refine.safetensors"
    )
    return folder / "upsampler", folder / "lora" / "refine.safetensors"


def build_tiny_ltx(folder: Path) -> None:
    """A tiny LTXPipeline: T5 text encoder, video transformer, video VAE."""
    tokenizer = transformers.T5Tokenizer(
        vocab=[("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -1.0)] + [(c, -2.0) for c in CHARACTERS],
        extra_ids=0,
    )
    torch.manual_seed(0)
    text_encoder = transformers.T5EncoderModel(
        transformers.T5Config(
            vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=32, num_layers=1, num_heads=4,
            relative_attention_num_buckets=8,
        )
    )
    transformer = diffusers.LTXVideoTransformer3DModel(
        in_channels=8, out_channels=8, patch_size=1, patch_size_t=1, num_attention_heads=4, attention_head_dim=8,
        cross_attention_dim=32, num_layers=1, caption_channels=32,
    )
    vae = diffusers.AutoencoderKLLTXVideo(
        latent_channels=8, block_out_channels=(8, 8), decoder_block_out_channels=(8, 8),
        down_block_types=("LTXVideoDownBlock3D",) * 2, spatio_temporal_scaling=(True, False),
        decoder_spatio_temporal_scaling=(True, False), layers_per_block=(1, 1, 1), decoder_layers_per_block=(1, 1, 1),
        decoder_inject_noise=(False,) * 3, downsample_type=("conv",) * 2, upsample_residual=(False,) * 2,
        upsample_factor=(1,) * 2, patch_size=1, patch_size_t=1,
    )
    diffusers.LTXPipeline(
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=text_encoder,
        tokenizer=tokenizer, transformer=transformer,
    ).save_pretrained(folder)


def tiny_settings(*, folder: Path, pipeline: str, data_dir: Path) -> Settings:
    return Settings(
        data_dir=data_dir, video_backend="diffusers", diffusers_model_path=folder, diffusers_pipeline=pipeline,
        torch_dtype="float32", video_width=SIZE, video_height=SIZE, video_frames=FRAMES, video_fps=FPS,
        video_steps=STEPS,
    )


@pytest.fixture(scope="module")
def ltx2_settings(tmp_path_factory) -> Settings:
    folder = tmp_path_factory.mktemp("tiny-ltx2")
    build_tiny_ltx2(folder)
    return tiny_settings(folder=folder, pipeline="ltx2", data_dir=tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def ltx_settings(tmp_path_factory) -> Settings:
    folder = tmp_path_factory.mktemp("tiny-ltx")
    build_tiny_ltx(folder)
    return tiny_settings(folder=folder, pipeline="ltx", data_dir=tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def two_stage_settings(ltx2_settings, tmp_path_factory) -> Settings:
    upsampler, lora = build_tiny_refiner(tmp_path_factory.mktemp("refiner"), ltx2_settings.diffusers.model_path)
    return ltx2_settings.model_copy(update={"diffusers_upsampler_path": upsampler, "diffusers_lora_path": lora})


def decoded(path: Path) -> tuple[np.ndarray, dict]:
    """The frames of an mp4 and ffmpeg's description of it (which names an audio stream's codec)."""
    reader = imageio_ffmpeg.read_frames(str(path))
    meta = next(reader)
    width, height = meta["size"]
    return np.stack([np.frombuffer(b, dtype=np.uint8).reshape(height, width, 3) for b in reader]), meta


def test_ltx2_renders_an_mp4_with_sound_and_reports_each_step(ltx2_settings, tmp_path):
    steps: list[tuple[int, int]] = []
    backend = video_backend(ltx2_settings)
    assert backend.name == "diffusers"
    output = tmp_path / "out" / "video.mp4"
    assert backend(prompt="a robot dancing", negative_prompt="blurry", seed=1, output=output, render_id="r",
                   progress=lambda done, total: steps.append((done, total))) == output
    frames, meta = decoded(output)
    assert frames.shape == (FRAMES, SIZE, SIZE, 3)
    assert meta["fps"] == FPS and meta["audio_codec"] == "aac"
    assert steps == [(1, STEPS), (2, STEPS)]
    assert sorted(p.name for p in output.parent.iterdir()) == ["video.mp4"]  # no partial files left


def test_same_seed_same_frames_and_the_pipeline_stays_resident(ltx2_settings, tmp_path):
    def render(seed: int, name: str) -> np.ndarray:
        backend = video_backend(ltx2_settings)  # a new backend per task, as gpu.tasks does
        return decoded(backend(prompt="a red fox", negative_prompt="", seed=seed, output=tmp_path / name,
                               render_id=name))[0]

    first = render(7, "a.mp4")
    manager = residency(ltx2_settings)
    loads = manager.stats().loads
    again, other = render(7, "b.mp4"), render(8, "c.mp4")
    assert np.array_equal(first, again)
    assert not np.array_equal(first, other)
    stats = manager.stats()
    assert stats.loads == loads and video_backend(ltx2_settings).key in stats.resident


def test_ltx_video_renders_frames_only(ltx_settings, tmp_path):
    manager = Residency(budget_bytes=None, device="cpu")
    backend = DiffusersBackend(settings=ltx_settings, residency=manager)
    steps: list[int] = []
    for seed in (3, 3):
        backend(prompt="dance monkey", negative_prompt="", seed=seed, output=tmp_path / f"{seed}.mp4",
                render_id=str(seed), progress=lambda done, total: steps.append(done))  # noqa: ARG005
    frames, meta = decoded(tmp_path / "3.mp4")
    assert frames.shape == (FRAMES, SIZE, SIZE, 3) and "audio_codec" not in meta
    assert steps == [1, 2, 1, 2]
    stats = manager.stats()
    assert (stats.loads, stats.hits) == (1, 1)
    pipeline = manager.get(backend.key, loader=lambda: pytest.fail("resident"))
    assert stats.resident_bytes == sum(module_bytes(m) for m in pipeline.components.values()
                                       if isinstance(m, torch.nn.Module))


def test_should_stop_ends_the_render_after_a_step_and_leaves_no_file(ltx_settings, tmp_path):
    manager = Residency(budget_bytes=None, device="cpu")
    backend = DiffusersBackend(settings=ltx_settings, residency=manager)
    steps: list[int] = []
    output = tmp_path / "video.mp4"
    with pytest.raises(RenderStopped, match="the diffusers render was stopped on request"):
        backend(prompt="dance monkey", negative_prompt="", seed=3, output=output, render_id="r",
                progress=lambda done, total: steps.append(done), should_stop=lambda: bool(steps))  # noqa: ARG005
    assert steps == [1]  # stopped at the first step's end, not after the whole render
    assert list(tmp_path.iterdir()) == []
    assert manager.stats().resident  # the pipeline stays loaded for the next render


def test_an_offloaded_pipeline_is_charged_its_largest_part(ltx_settings):
    pipeline = diffusers.LTXPipeline.from_pretrained(ltx_settings.diffusers.model_path)
    manager = Residency(budget_bytes=None, device="cpu")
    manager.get("ltx", loader=lambda: pipeline, offload="model")
    parts = [module_bytes(m) for m in pipeline.components.values() if isinstance(m, torch.nn.Module)]
    assert manager.stats().resident_bytes == max(parts) < sum(parts)




def test_the_two_stage_recipe_renders_twice_the_size_with_sound(two_stage_settings, tmp_path):
    manager = Residency(budget_bytes=None, device="cpu")
    backend = DiffusersBackend(settings=two_stage_settings, residency=manager)
    steps: list[tuple[int, int]] = []
    output = tmp_path / "video.mp4"
    backend(prompt="a robot dancing", negative_prompt="blurry", seed=1, output=output, render_id="r",
            progress=lambda done, total: steps.append((done, total)))
    frames, meta = decoded(output)
    assert frames.shape == (FRAMES, 2 * SIZE, 2 * SIZE, 3)  # latents upsampled x2, then refined
    assert meta["audio_codec"] == "aac"
    assert steps == [(n, STEPS + 3) for n in range(1, STEPS + 4)]  # stage 1, then the 3 refining steps
    stages = manager.get(backend.key, loader=lambda: pytest.fail("resident"))
    assert "latent_upsampler" in stages.components and stages.lora
    again = tmp_path / "again.mp4"
    backend(prompt="a robot dancing", negative_prompt="blurry", seed=1, output=again, render_id="r")
    assert np.array_equal(decoded(again)[0], frames)  # the LoRA and scheduler were put back after stage 2
    plain = two_stage_settings.model_copy(update={"diffusers_lora_path": None})
    without = tmp_path / "without.mp4"
    DiffusersBackend(settings=plain, residency=manager)(prompt="a robot dancing", negative_prompt="blurry", seed=1,
                                                        output=without, render_id="r")
    assert not np.array_equal(decoded(without)[0], frames)  # the LoRA did refine


def expected_device_bytes(parts: list[torch.nn.Module], offload: str) -> int:
    """What each mode keeps on the device, counted here from the modules' own tensors."""
    whole = [sum(t.numel() * t.element_size() for t in {id(t): t for t in [*p.parameters(), *p.buffers()]}.values())
             for p in parts]
    leaf = max(own_bytes(m) for p in parts for m in p.modules())
    return {"none": sum(whole), "model": max(whole), "group": 2 * leaf, "sequential": leaf}[offload]


@pytest.mark.parametrize("fp8", [False, True], ids=["float32", "fp8"])
@pytest.mark.parametrize("offload", ["none", "model", "group", "sequential"])
def test_each_offload_and_storage_mode_loads_renders_and_is_charged_what_it_keeps(ltx2_settings, tmp_path,
                                                                                  offload, fp8):
    settings = ltx2_settings.model_copy(update={"diffusers_offload": offload, "diffusers_fp8": fp8,
                                                "vae_tiling": offload == "group"})
    manager = Residency(budget_bytes=None, device="cpu")
    backend = DiffusersBackend(settings=settings, residency=manager)
    output = tmp_path / "video.mp4"
    backend(prompt="a red fox", negative_prompt="", seed=2, output=output, render_id="r")
    frames, meta = decoded(output)
    assert frames.shape == (FRAMES, SIZE, SIZE, 3) and meta["audio_codec"] == "aac"
    stages = manager.get(backend.key, loader=lambda: pytest.fail("resident"))
    transformer = stages.pipeline.transformer
    stored = {p.dtype for p in transformer.parameters()}
    assert (torch.float8_e4m3fn in stored) is fp8
    assert manager.stats().resident_bytes == expected_device_bytes(stages.modules, offload)


@pytest.mark.parametrize("offload", ["model", "group", "sequential"])
def test_the_two_stage_recipe_under_each_offload_mode_in_fp8_with_tiling(two_stage_settings, tmp_path, offload):
    settings = two_stage_settings.model_copy(update={"diffusers_offload": offload, "diffusers_fp8": True,
                                                     "vae_tiling": True})
    manager = Residency(budget_bytes=None, device="cpu")
    output = tmp_path / "video.mp4"
    DiffusersBackend(settings=settings, residency=manager)(prompt="a red fox", negative_prompt="", seed=2,
                                                           output=output, render_id="r")
    frames, meta = decoded(output)
    assert frames.shape == (FRAMES, 2 * SIZE, 2 * SIZE, 3) and meta["audio_codec"] == "aac"
    stages = manager.get(DiffusersBackend(settings=settings, residency=manager).key, loader=lambda: pytest.fail("x"))
    assert manager.stats().resident_bytes == expected_device_bytes(stages.modules, offload)


@pytest.fixture
def streamed_on_cpu(monkeypatch):
    """diffusers' group offloading as `group` runs it on a GPU (host copies of each leaf's tensors, brought on
    through a stream), with the CPU standing in for the device and a do-nothing stream: `offload(modules)`."""
    from diffusers.hooks import group_offloading

    class Stream:
        def synchronize(self) -> None:
            pass

    monkeypatch.setattr(torch.cpu, "current_stream", lambda *_: Stream())
    monkeypatch.setattr(torch.cpu, "stream", lambda _: contextlib.nullcontext())
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *_, **__: self)
    cpu = torch.device("cpu")
    config = group_offloading.GroupOffloadingConfig(
        onload_device=cpu,
        offload_device=cpu,
        offload_type=group_offloading.GroupOffloadingType.LEAF_LEVEL,
        non_blocking=False,
        record_stream=False,
        low_cpu_mem_usage=True,
        stream=Stream(),
    )

    def offload(modules: list[torch.nn.Module], *_) -> None:
        for module in modules:
            group_offloading._apply_group_offloading(module, config)

    return offload


@pytest.mark.parametrize("skips", ["diffusers' defaults", "the backend's"])
def test_fp8_storage_under_streamed_group_offloading(ltx2_settings, streamed_on_cpu, skips):
    """diffusers' layerwise casting casts a whole layer, buffers included, with `Module.to`, which replaces each
    buffer by a new tensor: Gemma's embedding scale is then rounded to fp8 and, on the next onload, missing from
    the host copies the streamed offloading keys by tensor (the KeyError a GPU showed). The backend keeps the
    layers that hold buffers out of fp8."""
    from diffusers.hooks import apply_layerwise_casting

    from gpu.ltx2_recipe import store_fp8

    encoder = transformers.Gemma3ForConditionalGeneration.from_pretrained(
        ltx2_settings.diffusers.model_path / "text_encoder"
    )
    embedding = encoder.get_input_embeddings()
    scale = float(embedding.embed_scale)
    if skips == "the backend's":
        store_fp8([encoder], torch.float32)
    else:
        apply_layerwise_casting(encoder, storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.float32)
    streamed_on_cpu([encoder])
    tokens = torch.tensor([[1, 2, 3]])
    if skips == "diffusers' defaults":
        assert float(embedding.embed_scale) != scale  # rounded to fp8
        with pytest.raises(KeyError):
            for _ in range(3):
                encoder(input_ids=tokens)
        return
    for _ in range(3):
        encoder(input_ids=tokens)
    assert float(embedding.embed_scale) == scale and embedding.weight.dtype == torch.float32
    assert encoder.model.language_model.layers[0].mlp.up_proj.weight.dtype == torch.float8_e4m3fn


def test_the_two_stage_recipe_in_fp8_under_streamed_group_offloading(
    two_stage_settings, streamed_on_cpu, tmp_path, monkeypatch
):
    from gpu import ltx2_recipe

    monkeypatch.setattr(ltx2_recipe, "offload", streamed_on_cpu)
    settings = two_stage_settings.model_copy(
        update={"diffusers_offload": "group", "diffusers_fp8": True, "vae_tiling": True}
    )
    backend = DiffusersBackend(settings=settings, residency=Residency(budget_bytes=None, device="cpu"))
    for seed in (1, 2):  # the second render onloads every leaf again
        output = tmp_path / f"{seed}.mp4"
        backend(prompt="a red fox", negative_prompt="", seed=seed, output=output, render_id="r")
        assert decoded(output)[0].shape == (FRAMES, 2 * SIZE, 2 * SIZE, 3)
