"""What torch modules take in memory, counted from their own tensors: one count for the residency manager, the
census of real-size models and the tests. Torch only, so the GPU memory bench runs without the studio's
dependencies."""

from __future__ import annotations

from torch import nn

__all__ = ["device_bytes", "module_bytes", "own_bytes"]


def module_bytes(module: nn.Module) -> int:
    """Bytes of a module's parameters and buffers (shared tensors counted once)."""
    tensors = {id(t): t for t in (*module.parameters(), *module.buffers())}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def own_bytes(module: nn.Module) -> int:
    """Bytes of the tensors a module holds itself, not its children's: what leaf-level offloading moves at once."""
    return sum(t.numel() * t.element_size() for t in (*module.parameters(False), *module.buffers(False)))


def device_bytes(parts: list[nn.Module], offload: str) -> int:
    """What `parts` keep on the device at most under `offload`: all of them (none), the largest whole model
    (model), the two largest leaf modules' worth (group: the running one and the prefetched next), one
    leaf (sequential)."""
    if not parts:
        return 0
    if offload == "none":
        return sum(module_bytes(p) for p in parts)
    if offload == "model":
        return max(module_bytes(p) for p in parts)
    leaf = max(own_bytes(m) for p in parts for m in p.modules())
    return 2 * leaf if offload == "group" else leaf
