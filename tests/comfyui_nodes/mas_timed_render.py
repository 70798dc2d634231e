"""A ComfyUI custom node for the studio's tests and benchmarks: a render of a chosen duration, no weights.

`MasTimedRender` spends `seconds` in `steps` steps, reporting each through ComfyUI's progress bar (real
`progress` events) and checking ComfyUI's interrupt flag every few milliseconds (real interrupts), then
returns `frames` random images seeded by `seed`: CreateVideo and SaveVideo turn them into a real mp4.
The text input is part of the prompt, so two prompts differ in an executed input and ComfyUI's cache
never answers one for another. It stands in for a video model's GPU time, and says so.
"""

import time

import comfy.model_management
import comfy.utils
import torch

CHECK_SECONDS = 0.01


class MasTimedRender:
    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "text": ("STRING", {"multiline": True, "default": ""}),
                "seed": ("INT", {"default": 0, "min": 0, "max": 0xFFFFFFFFFFFFFFFF}),
                "seconds": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 86400.0, "step": 0.001}),
                "steps": ("INT", {"default": 4, "min": 1, "max": 10000}),
                "frames": ("INT", {"default": 8, "min": 1, "max": 1000}),
                "width": ("INT", {"default": 64, "min": 16, "max": 4096, "step": 16}),
                "height": ("INT", {"default": 48, "min": 16, "max": 4096, "step": 16}),
            }
        }

    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "render"
    CATEGORY = "mas/testing"

    def render(self, text, seed, seconds, steps, frames, width, height):  # noqa: ARG002
        bar = comfy.utils.ProgressBar(steps)
        for _ in range(steps):
            step_end = time.monotonic() + seconds / steps
            while (left := step_end - time.monotonic()) > 0:
                comfy.model_management.throw_exception_if_processing_interrupted()
                time.sleep(min(left, CHECK_SECONDS))
            bar.update(1)
        comfy.model_management.throw_exception_if_processing_interrupted()
        generator = torch.Generator().manual_seed(seed % (1 << 63))
        return (torch.rand((frames, height, width, 3), generator=generator),)


NODE_CLASS_MAPPINGS = {"MasTimedRender": MasTimedRender}
NODE_DISPLAY_NAME_MAPPINGS = {"MasTimedRender": "Timed render (mas tests, no model)"}
