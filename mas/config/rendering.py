"""The GPU side: what renders videos and at what size, ComfyUI, the in-process diffusers pipeline, the gpu
worker, and how videos are graded."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from mas.config.base import Group, http_url, parse_json
from mas.grades import Grade


class VideoSettings(Group):
    """What renders videos on the gpu queue, and the videos' size and length."""

    backend: Literal["preview", "comfyui", "diffusers"] = Field(
        validation_alias="MAS_VIDEO_BACKEND", default="preview", description="What renders videos on the gpu queue."
    )
    width: int = Field(
        validation_alias="MAS_VIDEO_WIDTH",
        default=768,
        gt=0,
        le=8192,
        description="Rendered width in pixels (multiple of 32).",
    )
    height: int = Field(
        validation_alias="MAS_VIDEO_HEIGHT",
        default=512,
        gt=0,
        le=8192,
        description="Rendered height in pixels (multiple of 32).",
    )
    frames: int = Field(
        validation_alias="MAS_VIDEO_FRAMES",
        default=121,
        gt=0,
        le=10_000,
        description="Frames per video (LTX wants 8k+1).",
    )
    fps: int = Field(
        validation_alias="MAS_VIDEO_FPS", default=24, gt=0, le=240, description="Frames per second of the written mp4."
    )
    steps: int = Field(
        validation_alias="MAS_VIDEO_STEPS", default=40, gt=0, le=1000, description="Denoising steps per render."
    )
    guidance_scale: float = Field(
        validation_alias="MAS_VIDEO_GUIDANCE_SCALE",
        default=3.0,
        ge=1.0,
        le=30.0,
        description="Classifier-free guidance of the first stage (1: none, one pass per step).",
    )
    preview_render_seconds: float = Field(
        validation_alias="MAS_PREVIEW_RENDER_SECONDS",
        default=0.0,
        ge=0,
        le=86_400,
        description="Simulated duration of a preview render (demos, benchmarks, tests).",
    )


class ComfyUISettings(Group):
    """The ComfyUI server and the workflow template of the comfyui video backend."""

    url: str = Field(
        validation_alias="MAS_COMFYUI_URL",
        default="http://127.0.0.1:8188",
        description="ComfyUI server (comfyui backend).",
    )
    workflow: Path | None = Field(
        validation_alias="MAS_COMFYUI_WORKFLOW",
        default=None,
        description="API-format workflow JSON used as the template for every render.",
    )
    nodes: dict[str, str] = Field(
        validation_alias="MAS_COMFYUI_NODES",
        default={
            "prompt": "5222.value",
            "seed": "5232:5158.noise_seed",
            "output": "5075",
        },
        description="Where the template takes each value, as NODE_ID.INPUT_NAME (output: the SaveVideo "
        "node id). Optional keys: negative_prompt, width, height, frames, fps.",
    )
    retries: int = Field(
        validation_alias="MAS_COMFYUI_RETRIES",
        default=3,
        ge=0,
        le=100,
        description="Retries of transient ComfyUI errors.",
    )
    _check_url = field_validator("url")(http_url)
    _parse_nodes = field_validator("nodes", mode="before")(parse_json)


class DiffusersSettings(Group):
    """The in-process LTX-2 pipeline of the diffusers video backend."""

    model_path: Path | None = Field(
        validation_alias="MAS_DIFFUSERS_MODEL_PATH",
        default=None,
        description="Local folder of an LTX-2 (or LTX-Video) diffusers pipeline.",
    )
    pipeline: Literal["ltx2", "ltx"] = Field(
        validation_alias="MAS_DIFFUSERS_PIPELINE",
        default="ltx2",
        description="LTX2Pipeline (LTX-2) or LTXPipeline (LTX-Video).",
    )
    offload: Literal["none", "model", "group", "sequential"] = Field(
        validation_alias="MAS_DIFFUSERS_OFFLOAD",
        default="none",
        description="What of the in-process pipeline stays on the GPU: none (everything), model (one whole model "
        "at a time), group (leaf modules as they run, the next prefetched), sequential (one leaf module at a time; "
        "slowest, least memory). `mas gpu plan` says which fit a card.",
    )
    fp8: bool = Field(
        validation_alias="MAS_DIFFUSERS_FP8",
        default=False,
        description="Store the LTX-2 transformer's and text encoder's weights in fp8 (float8_e4m3fn), computing in "
        "MAS_TORCH_DTYPE layer by layer (diffusers' layerwise casting): half their bytes.",
    )
    upsampler_path: Path | None = Field(
        validation_alias="MAS_DIFFUSERS_UPSAMPLER_PATH",
        default=None,
        description="Local folder of LTX-2's latent upsampler (LTX2LatentUpsamplerModel). Set: the two-stage recipe "
        "(render at the configured size, upsample the latents x2, refine), so the video is twice the size.",
    )
    lora_path: Path | None = Field(
        validation_alias="MAS_DIFFUSERS_LORA_PATH",
        default=None,
        description="LTX-2's distilled LoRA (a .safetensors file), applied for the refining stage only.",
    )
    distilled: bool = Field(
        validation_alias="MAS_DIFFUSERS_DISTILLED",
        default=False,
        description="The model is LTX-2's distilled checkpoint: its 8 fixed sigmas, no guidance (MAS_VIDEO_STEPS "
        "and MAS_VIDEO_GUIDANCE_SCALE are not used for the first stage).",
    )
    cpu_offload: bool = Field(
        validation_alias="MAS_CPU_OFFLOAD",
        default=False,
        description="Offload idle pipeline parts to CPU (low VRAM); the same as MAS_DIFFUSERS_OFFLOAD=model.",
    )
    vae_tiling: bool = Field(
        validation_alias="MAS_VAE_TILING",
        default=False,
        description="Decode the video in tiles (diffusers' VAE tiling): far less memory at decode.",
    )

    @property
    def offload_mode(self) -> str:
        """MAS_DIFFUSERS_OFFLOAD, with the older MAS_CPU_OFFLOAD=true read as model offload."""
        return "model" if self.cpu_offload and self.offload == "none" else self.offload


class GpuSettings(Group):
    """The gpu worker: its device and memory, the order of its work, and how long and how often a gpu step runs."""

    grouping: bool | Literal["auto"] = Field(
        validation_alias="MAS_GPU_GROUPING",
        default="auto",
        description="True: queue gradings apart from renders and let the gpu worker stay with one kind while "
        "it has work (fewer model swaps, but no grading, so no accepted video, until a run of renders ends); "
        "False: a grading is taken right after its render. auto: grouped only when the video model runs in "
        "the gpu worker's own process (diffusers), where it and the grader may not both stay loaded; with "
        "ComfyUI the video model stays loaded there and the grader here.",
    )
    lookahead: int = Field(
        validation_alias="MAS_GPU_LOOKAHEAD",
        default=1,
        ge=0,
        le=16,
        description="GPU tasks a gpu worker holds besides the one on the GPU, so the GPU goes from one to the "
        "next without waiting on the studio: with ComfyUI, renders queued there behind the running one; in "
        "process, tasks read and waiting for their turn. 0: one task at a time.",
    )
    device: str = Field(
        validation_alias="MAS_GPU_DEVICE",
        default="",
        pattern=r"^(|cpu|cuda(:[0-9]+)?)$",
        description="The device of this gpu worker's in-process models (cuda:N); empty: the first CUDA device, "
        "else the CPU. `mas worker --queue gpu --device cuda:N` sets it per worker.",
    )
    streak_limit: int = Field(
        validation_alias="MAS_GPU_STREAK_LIMIT",
        default=50,
        ge=0,
        le=100_000,
        description="After this many gpu tasks of one kind in a row, the other kind goes first once if it "
        "has work waiting, so gradings are not held back for a whole batch; 0: no limit.",
    )
    torch_dtype: Literal["bfloat16", "float16", "float32"] = Field(
        validation_alias="MAS_TORCH_DTYPE",
        default="bfloat16",
        description="Weights dtype of models loaded on the GPU worker.",
    )
    vram_budget_gb: float = Field(
        validation_alias="MAS_VRAM_BUDGET_GB",
        default=0.0,
        ge=0,
        description="VRAM the resident models may use; 0 = the device's total. A gpu worker refuses at start an "
        "in-process LTX-2 recipe whose peak cannot fit it (`mas gpu plan` says which settings do).",
    )
    max_render_seconds: int = Field(
        validation_alias="MAS_MAX_RENDER_SECONDS",
        default=1800,
        gt=0,
        le=7 * 86_400,
        description="Longest a single GPU task may run before it is killed.",
    )
    step_retries: int = Field(
        validation_alias="MAS_STEP_RETRIES",
        default=2,
        ge=0,
        le=100,
        description="Retries of a failed render or grade before the video is skipped.",
    )
    tune_max_seconds: int = Field(
        validation_alias="MAS_TUNE_MAX_SECONDS",
        default=3600,
        gt=0,
        description="Longest a Tuner run (DPO training) may hold the GPU.",
    )
    regrade_max_seconds: int = Field(
        validation_alias="MAS_REGRADE_MAX_SECONDS",
        default=600,
        gt=0,
        description="Longest `mas grade` may hold the GPU for one video.",
    )


class QualitySettings(Group):
    """How videos are graded (the grader, DQA's models and weights) and what the studio accepts."""

    grader: Literal["preview", "dqa"] = Field(
        validation_alias="MAS_GRADER", default="preview", description="What grades videos on the gpu queue."
    )
    clip_model_path: Path | None = Field(
        validation_alias="MAS_CLIP_MODEL_PATH",
        default=None,
        description="Local CLIP-family model folder (transformers) for prompt adherence.",
    )
    preference_base_model_path: Path | None = Field(
        validation_alias="MAS_PREFERENCE_BASE_MODEL_PATH",
        default=None,
        description="Local causal LM folder the Tuner trains DPO LoRA adapters on.",
    )
    dqa_weights: tuple[float, float, float, float, float] = Field(
        validation_alias="MAS_DQA_WEIGHTS",
        default=(0.25, 0.15, 0.20, 0.25, 0.15),
        description="Weights of semantic, spatial, benchmark, preference and multi-axis scores.",
    )
    dqa_frames: int = Field(
        validation_alias="MAS_DQA_FRAMES", default=8, gt=0, description="Frames sampled per video for scoring."
    )
    min_preference_pairs: int = Field(
        validation_alias="MAS_MIN_PREFERENCE_PAIRS",
        default=8,
        gt=0,
        description="A/B pairs a user needs before the Tuner fits their taste (pairwise and DPO).",
    )
    min_acceptable_grade: Grade = Field(
        validation_alias="MAS_MIN_ACCEPTABLE_GRADE",
        default="B",
        description="Default quality_standards.MIN_ACCEPTABLE_GRADE.",
    )
    max_retries: int = Field(
        validation_alias="MAS_MAX_RETRIES",
        default=3,
        ge=1,
        le=20,
        description="Default quality_standards.MAX_RETRIES (at most the block's own cap, 20).",
    )
    _parse_weights = field_validator("dqa_weights", mode="before")(parse_json)
