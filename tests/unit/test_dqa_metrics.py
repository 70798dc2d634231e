"""DQA's benchmark metrics on synthetic frames: motion, jitter, noise and blur are seen. Pure computation."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from gpu.dqa_phases import DQAConfig, benchmark, block_flow, imaging_quality
from tests.integration.test_dqa import shape_image


def test_benchmark_metrics_see_motion_jitter_noise_and_blur():
    rng = np.random.default_rng(0)
    texture = F.avg_pool2d(torch.rand(1, 1, 96, 128, generator=torch.Generator().manual_seed(0)), 3, 1, 1)[0, 0]
    steady = torch.stack([torch.roll(texture, (0, 2 * i), (0, 1)) for i in range(10)])
    shifts = np.cumsum(rng.integers(-6, 7, 10))
    jittery = torch.stack([torch.roll(texture, (0, int(s)), (0, 1)) for s in shifts])
    still = texture.expand(10, -1, -1)
    flow, _ = block_flow(steady, grid=4)
    assert torch.allclose(flow[..., 1], torch.full_like(flow[..., 1], 2.0), atol=0.2)  # 2 px right per frame
    assert torch.allclose(flow[..., 0], torch.zeros_like(flow[..., 0]), atol=0.2)
    def metrics(luma: torch.Tensor) -> dict[str, float]:
        frames = (luma[:, None].expand(-1, 3, -1, -1) * 255).round().to(torch.uint8)
        return benchmark(frames, frames[::3].float() / 255, config=DQAConfig())

    smooth, shaky, static = metrics(steady), metrics(jittery), metrics(still)
    assert smooth["motion_smoothness"] > 0.9 and shaky["motion_smoothness"] < 0.5
    assert smooth["dynamic_degree"] == 1.0 and static["dynamic_degree"] == 0.0
    shots = np.stack([shape_image("red circle", rng=rng, size=128, radius=30) for _ in range(3)])
    clean = torch.from_numpy(shots).permute(0, 3, 1, 2).float() / 255
    noisy = (clean + torch.randn(clean.shape, generator=torch.Generator().manual_seed(1)) * 0.1).clamp(0, 1)
    blurry = F.avg_pool2d(clean, 9, 1, 4, count_include_pad=False)
    quality = {name: imaging_quality(x, config=DQAConfig()) for name, x in
               {"clean": clean, "noisy": noisy, "blurry": blurry}.items()}
    assert quality["clean"] > quality["noisy"] + 0.15 and quality["clean"] > quality["blurry"] + 0.1
