"""The measuring phases of Dynamic Quality Alignment: what `gpu.dqa.DQAGrader` runs on one video's frames.

1. Verification: one CLIP-family model (MAS_CLIP_MODEL_PATH) embeds sampled frames, frame regions and
   texts. It gives `semantic` (CLIPScore of each frame against the prompt, averaged over time), `spatial`
   (for each subject phrase of the prompt, the best-matching region of each frame: full frame, 2x2 and 3x3
   tiles, in the spirit of ProxyCLIP's region-level grounding), `subject_consistency` (frame-to-frame
   similarity of the image embeddings, as VBench measures it with DINO features), and the CLIP-answered
   checklist questions of the multi-axis decomposition (CLIP-IQA style antonym prompts, standing in for
   VisionReward's VLM checklist). One backbone serves all of them, as the whitepaper's "shared backbone".
2. Benchmark: no model; classical measurements on the decoded frames. A block phase-correlation flow
   field gives `dynamic_degree` (share of frame pairs that move) and `motion_smoothness` (how little the
   motion accelerates between frames); `imaging_quality` combines a noise estimate (Immerkær 1996), a
   re-blur sharpness measure (Crété-Roffet et al. 2007) and exposure clipping; brightness flicker feeds the
   multi-axis `motion`.

Both are plain functions of tensors and a `DQAConfig`: no settings, no database, no residency.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
"""OpenAI CLIP's pixel normalisation, used when a model folder has no preprocessor_config.json."""

CHECKLISTS: dict[str, tuple[tuple[str, str], ...]] = {
    "aesthetic": (
        ("a beautiful photo", "an ugly photo"),
        ("a well composed image", "a badly composed image"),
        ("pleasing colours and lighting", "dull, flat colours and lighting"),
    ),
    "fidelity": (
        ("a sharp photo", "a blurry photo"),
        ("a clean photo", "a noisy photo"),
        ("a detailed, realistic image", "a distorted image with artifacts"),
    ),
    "motion": (("a crisp frame", "a frame smeared by motion blur"),),
    "coherence": (("a coherent, natural scene", "a chaotic, incoherent scene"),),
}
"""Yes/no questions per multi-axis dimension, as (yes, no) captions; CLIP answers each frame with the
softmax of its two similarities (CLIP-IQA, Wang et al. 2023)."""


@dataclass(frozen=True, kw_only=True)
class DQAConfig:
    """How the phases measure; MAS_ settings choose models, frame count and weights."""

    region_grids: tuple[int, ...] = field(
        default=(2, 3), metadata={"help": "Tilings of each frame searched for the prompt's subject phrases."}
    )
    max_phrases: int = field(
        default=3, metadata={"help": "Subject phrases taken from the prompt: its first comma-separated parts."}
    )
    clipscore_weight: float = field(
        default=2.5, metadata={"help": "CLIPScore's w: score = clamp(w * cosine, 0, 1) (Hessel et al. 2021)."}
    )
    checklists: Mapping[str, tuple[tuple[str, str], ...]] = field(
        default_factory=lambda: CHECKLISTS, metadata={"help": "Multi-axis questions CLIP answers per frame."}
    )
    motion_side: int = field(
        default=256, metadata={"help": "Frames are downscaled to this longest side for flow and flicker."}
    )
    flow_grid: int = field(default=4, metadata={"help": "Blocks per side of the phase-correlation flow field."})
    flow_whitening: float = field(
        default=0.5,
        metadata={
            "help": "Exponent of the spectrum normalisation: 1 is pure phase correlation, 0 plain "
            "cross-correlation; in between resists noise and low texture."
        },
    )
    flow_smoothing: float = field(
        default=1.5, metadata={"help": "Gaussian smoothing (pixels) of the correlation surface before the peak search."}
    )
    trackable_snr: float = field(
        default=3.0, metadata={"help": "A block is tracked when its luma contrast exceeds this many noise sigmas."}
    )
    trackable_contrast: float = field(
        default=0.01, metadata={"help": "...and at least this luma standard deviation (0-1 grey)."}
    )
    moving_shift: float = field(
        default=0.004,
        metadata={
            "help": "A frame pair moves when a quarter of its tracked blocks shift by more than this "
            "share of the width."
        },
    )
    jerk_scale: float = field(
        default=0.01,
        metadata={"help": "motion_smoothness = exp(-mean frame-to-frame change of the flow / this), in widths."},
    )
    noise_scale: float = field(
        default=12.0, metadata={"help": "imaging noise score = exp(-sigma / this), sigma in 0-255 grey levels."}
    )
    flicker_scale: float = field(
        default=0.02, metadata={"help": "steadiness = exp(-mean brightness jump between frames / this)."}
    )


# --- Phase 1: verification (one CLIP-family backbone) ------------------------------------------------


def subject_phrases(prompt: str, *, limit: int) -> list[str]:
    """The prompt's first comma- or semicolon-separated parts: prompts lead with their subject."""
    parts = [p.strip() for p in prompt.replace(";", ",").split(",")]
    return [p for p in parts if p][:limit] or [prompt.strip()]


class ClipScorer(nn.Module):
    """A CLIP-family model with its tokenizer and pixel normalisation, resident as one unit."""

    mean: torch.Tensor  # buffers, registered in __init__
    std: torch.Tensor

    def __init__(self, *, model: Any, tokenizer: Any, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.image_size = int(model.config.vision_config.image_size)
        self.max_tokens = int(model.config.text_config.max_position_embeddings)
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1), persistent=False)

    @classmethod
    def load(cls, folder: Path, *, dtype: torch.dtype) -> ClipScorer:
        from transformers import AutoModel, AutoTokenizer

        model = AutoModel.from_pretrained(folder, dtype=dtype, local_files_only=True).eval()
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        mean, std = CLIP_MEAN, CLIP_STD
        if (config := folder / "preprocessor_config.json").is_file():
            values = json.loads(config.read_text())
            mean, std = values.get("image_mean", mean), values.get("image_std", std)
        return cls(model=model, tokenizer=tokenizer, mean=mean, std=std)

    @property
    def device(self) -> torch.device:
        return self.mean.device

    @property
    def logit_scale(self) -> float:
        return float(self.model.logit_scale.detach().exp())

    @torch.inference_mode()
    def embed_images(self, images: torch.Tensor, *, batch_size: int = 64) -> torch.Tensor:
        """Unit image embeddings of float RGB images (n, 3, h, w) in [0, 1], each squashed to the model's
        square input whole, so nothing at a frame's edges is cropped away."""
        dtype = next(self.model.parameters()).dtype
        out = []
        for start in range(0, len(images), batch_size):
            chunk = images[start : start + batch_size].to(self.device, torch.float32)
            chunk = F.interpolate(
                chunk, size=(self.image_size, self.image_size), mode="bilinear", antialias=True, align_corners=False
            )
            pixels = ((chunk - self.mean) / self.std).to(dtype)
            out.append(_features(self.model.get_image_features(pixel_values=pixels)))
        return F.normalize(torch.cat(out).float(), dim=-1)

    @torch.inference_mode()
    def embed_texts(self, texts: Sequence[str]) -> torch.Tensor:
        """Unit text embeddings; texts longer than the model's context are cut (CLIP reads 77 tokens)."""
        tokens = self.tokenizer(
            list(texts), padding=True, truncation=True, max_length=self.max_tokens, return_tensors="pt"
        ).to(self.device)
        features = self.model.get_text_features(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"])
        return F.normalize(_features(features).float(), dim=-1)


def _features(output: Any) -> torch.Tensor:
    """transformers 5 returns a model output whose pooler_output is the projected embedding; 4.x a tensor."""
    return output if isinstance(output, torch.Tensor) else output.pooler_output


def regions(frames: torch.Tensor, *, grids: Sequence[int], size: int) -> torch.Tensor:
    """Each frame whole plus its tiles for every grid, squashed to `size`: (frames, regions, 3, size, size)."""
    count = len(frames)
    out = [F.interpolate(frames, size=(size, size), mode="bilinear", antialias=True, align_corners=False)[:, None]]
    for g in grids:
        tiled = F.interpolate(frames, size=(g * size, g * size), mode="bilinear", antialias=True, align_corners=False)
        tiles = tiled.unfold(2, size, size).unfold(3, size, size)  # (frames, 3, g, g, size, size)
        out.append(tiles.permute(0, 2, 3, 1, 4, 5).reshape(count, g * g, 3, size, size))
    return torch.cat(out, dim=1)


def verify(scorer: ClipScorer, frames: torch.Tensor, *, prompt: str, config: DQAConfig) -> dict[str, float]:
    """Phase 1 on sampled frames (float RGB in [0, 1], (frames, 3, h, w)): semantic, spatial, subject
    consistency, semantic stability and the checklist answers of each multi-axis dimension."""
    w = config.clipscore_weight
    tiles = regions(frames.to(scorer.device, torch.float32), grids=config.region_grids, size=scorer.image_size)
    count, per_frame = tiles.shape[:2]
    embedded = scorer.embed_images(tiles.flatten(0, 1)).view(count, per_frame, -1)
    whole = embedded[:, 0]
    phrases = subject_phrases(prompt, limit=config.max_phrases)
    texts = scorer.embed_texts([prompt, *phrases])
    frame_scores = (w * whole @ texts[0]).clamp(0, 1)
    phrase_scores = (w * embedded @ texts[1:].T).clamp(0, 1).amax(dim=1)  # best region per frame and phrase
    mean = float(frame_scores.mean())
    measured = {
        "semantic": mean,
        "spatial": float(phrase_scores.mean()),
        "subject_consistency": _consistency(whole),
        "semantic_stability": max(0.0, 1.0 - float(frame_scores.std(correction=0)) / mean) if mean > 0 else 0.0,
    }
    for dimension, questions in config.checklists.items():
        answers = scorer.embed_texts([caption for pair in questions for caption in pair]).view(len(questions), 2, -1)
        logits = scorer.logit_scale * torch.einsum("fd,qad->fqa", whole, answers)
        measured[f"checklist_{dimension}"] = float(logits.softmax(dim=-1)[..., 0].mean())
    return measured


def _consistency(embeddings: torch.Tensor) -> float:
    """VBench subject consistency: mean over frames of the similarity to the first and to the previous frame."""
    if len(embeddings) < 2:
        return 1.0
    to_first = embeddings[1:] @ embeddings[0]
    to_previous = (embeddings[1:] * embeddings[:-1]).sum(-1)
    return float(((to_first + to_previous) / 2).clamp(0, 1).mean())


# --- Phase 2: benchmark (classical measurements, no model) -------------------------------------------


def grey(frames: torch.Tensor) -> torch.Tensor:
    """ITU-R BT.601 luma of float RGB frames (n, 3, h, w) in [0, 1]: (n, h, w)."""
    r, g, b = frames.unbind(1)
    return 0.299 * r + 0.587 * g + 0.114 * b


def block_flow(
    luma: torch.Tensor, *, grid: int, whitening: float = 0.5, smoothing: float = 1.5
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-block translation between consecutive frames by generalised phase correlation, with sub-pixel
    peaks: (pairs, blocks, 2) as (dy, dx) in pixels, and each frame's block contrast (frames, blocks) as
    the luma standard deviation. A coarse optical flow: blocks, not pixels, move.

    Pure phase correlation weighs every frequency alike, so in noisy or weakly textured blocks the noise
    wins; a partial normalisation (`whitening` < 1) and a Gaussian low-pass of the surface keep the peak
    on the image's own structure.
    """
    n, h, w = luma.shape
    bh, bw = h // grid, w // grid
    blocks = luma[:, : bh * grid, : bw * grid].unfold(1, bh, bh).unfold(2, bw, bw).reshape(n, grid * grid, bh, bw)
    window = torch.outer(
        torch.hann_window(bh, periodic=False, device=luma.device),
        torch.hann_window(bw, periodic=False, device=luma.device),
    )
    spectra = torch.fft.fft2((blocks - blocks.mean(dim=(-2, -1), keepdim=True)) * window)
    cross = spectra[1:] * spectra[:-1].conj()
    ky = torch.fft.fftfreq(bh, device=luma.device)[:, None]
    kx = torch.fft.fftfreq(bw, device=luma.device)[None, :]
    lowpass = torch.exp(-2 * (math.pi * smoothing) ** 2 * (ky.square() + kx.square()))
    # the surface peaks at the shift from frame t to t+1
    surface = torch.fft.ifft2(cross / (cross.abs() + 1e-9) ** whitening * lowpass).real.flatten(-2)
    peak = surface.argmax(-1)
    py, px = peak // bw, peak % bw

    def value(dy: int, dx: int) -> torch.Tensor:
        index = ((py + dy) % bh) * bw + (px + dx) % bw
        return surface.gather(-1, index.unsqueeze(-1)).squeeze(-1)

    centre = value(0, 0)

    def offset(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
        """Vertex of the parabola through the peak and its two neighbours."""
        bend = before - 2 * centre + after
        vertex = (before - after) / (2 * bend.where(bend.abs() > 1e-9, torch.ones_like(bend)))
        return vertex.where(bend.abs() > 1e-9, torch.zeros_like(bend)).clamp(-0.5, 0.5)

    dy = py.float() + offset(value(-1, 0), value(1, 0))
    dx = px.float() + offset(value(0, -1), value(0, 1))
    dy = dy.where(dy <= bh / 2, dy - bh)  # the surface wraps: a peak past the middle is a negative shift
    dx = dx.where(dx <= bw / 2, dx - bw)
    return torch.stack([dy, dx], dim=-1), blocks.std(dim=(-2, -1))


def small_luma(frames: torch.Tensor, *, side: int, chunk: int = 16) -> torch.Tensor:
    """Luma of uint8 frames (n, 3, h, w), area-downscaled to `side` at most, converted a chunk at a time so
    a long video never sits on the device as floats at full size."""
    h, w = frames.shape[-2:]
    scale = min(1.0, side / max(h, w))
    out = []
    for start in range(0, len(frames), chunk):
        part = frames[start : start + chunk].float().div(255)
        if scale < 1.0:
            part = F.interpolate(part, scale_factor=scale, mode="area")
        out.append(grey(part))
    return torch.cat(out)


def benchmark(frames: torch.Tensor, sampled: torch.Tensor, *, config: DQAConfig) -> dict[str, float]:
    """Phase 2: motion metrics on every frame (uint8, downscaled), imaging quality on the sampled frames
    (float, full size)."""
    n = len(frames)
    luma = small_luma(frames, side=config.motion_side)
    measured: dict[str, float] = {}
    if n >= 2:
        flow, contrast = block_flow(
            luma, grid=config.flow_grid, whitening=config.flow_whitening, smoothing=config.flow_smoothing
        )
        flow = flow / luma.shape[-1]  # in widths per frame
        # only blocks with structure well above the noise are tracked: a featureless block (sky, a wall)
        # reads noise, not motion
        floor = (config.trackable_snr * noise_sigma(luma[:, None])).clamp(min=config.trackable_contrast)
        tracked = contrast > floor[:, None]
        pairs = tracked[1:] & tracked[:-1]
        nan = torch.tensor(float("nan"), device=flow.device)
        speed = flow.norm(dim=-1).where(pairs, nan)
        moving = speed.nanquantile(0.75, dim=-1) > config.moving_shift  # no tracked block: not moving
        measured["dynamic_degree"] = float(moving.float().mean())
        jerk = (flow[1:] - flow[:-1]).norm(dim=-1).where(pairs[1:] & pairs[:-1], nan).nanmedian(dim=-1).values
        jerk = jerk[~jerk.isnan()]
        # nothing trackable moves unevenly: a featureless or two-frame video shows no jitter
        measured["motion_smoothness"] = math.exp(-float(jerk.mean()) / config.jerk_scale) if len(jerk) else 1.0
        jumps = luma.mean(dim=(-2, -1)).diff().abs().mean()
        measured["steadiness"] = math.exp(-float(jumps) / config.flicker_scale)
    else:  # a single still frame: no motion, nothing unsteady
        measured.update(dynamic_degree=0.0, motion_smoothness=1.0, steadiness=1.0)
    measured["imaging_quality"] = imaging_quality(sampled, config=config)
    return measured


def noise_sigma(luma: torch.Tensor) -> torch.Tensor:
    """Immerkær's (1996) fast noise estimate per frame of (n, 1, h, w), in the units of the luma:
    sigma = sqrt(pi/2) / (6 (W-2)(H-2)) * sum |I * M|, M the difference of two Laplacians."""
    kernel = torch.tensor([[1.0, -2.0, 1.0], [-2.0, 4.0, -2.0], [1.0, -2.0, 1.0]], device=luma.device)
    return math.sqrt(math.pi / 2) / 6 * F.conv2d(luma, kernel[None, None]).abs().mean(dim=(-3, -2, -1))


def imaging_quality(frames: torch.Tensor, *, config: DQAConfig) -> float:
    """Mean over frames of (low noise, sharpness, unclipped exposure), each in [0, 1]."""
    luma = grey(frames)[:, None]
    noise = torch.exp(-noise_sigma(luma) * 255 / config.noise_scale)
    sharpness = 1 - reblur(luma)
    clipped = ((frames <= 2 / 255) | (frames >= 253 / 255)).float().mean(dim=(-3, -2, -1))
    return float(((noise + sharpness + (1 - clipped)) / 3).mean())


def reblur(luma: torch.Tensor, *, taps: int = 9) -> torch.Tensor:
    """Crété-Roffet et al. (2007) no-reference blur in [0, 1] per frame of (n, 1, h, w): blur the frame
    again and see how much of its pixel-to-pixel variation survives. A sharp frame loses most of it, an
    already blurry one little. The worse of the two directions counts."""
    blurs = []
    half = taps // 2
    for dim, pad, pool in ((-1, (half, half, 0, 0), (1, taps)), (-2, (0, 0, half, half), (taps, 1))):
        blurred = F.avg_pool2d(F.pad(luma, pad, mode="replicate"), pool, stride=1)
        sharp_var, blur_var = luma.diff(dim=dim).abs(), blurred.diff(dim=dim).abs()
        total = sharp_var.sum(dim=(-3, -2, -1)).clamp(min=1e-9)
        lost = (sharp_var - blur_var).clamp(min=0).sum(dim=(-3, -2, -1))
        blurs.append((total - lost) / total)
    return torch.stack(blurs).amax(dim=0)
