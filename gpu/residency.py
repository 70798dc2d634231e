"""Model residency for the GPU worker: models stay loaded between tasks, within a VRAM budget.

Loading is the expensive part of GPU work here (LTX-2 is 19B parameters; its text encoder alone is ~24 GB),
so the worker keeps every model it has used on the device until the budget runs out. When a new model
needs room, the least recently used ones are evicted: parked in host memory (`.to("cpu")`) when they fit
there, so that bringing them back is a copy rather than a load from disk, or dropped entirely when they do
not. `stats()` counts loads, swaps (a parked model brought back) and evictions, so a batch's model churn can
be measured.

Models load in the process that uses them, on first need: the Celery GPU worker forks its pool child
before any task runs, and CUDA initialised in a parent does not survive a fork. The manager is not
thread-safe; it does not need to be, because the gpu queue runs with concurrency 1. It knows no backend:
whoever builds it (`gpu.factory`) passes what must happen before a load, such as asking a ComfyUI server
sharing the GPU to free its memory.
"""

from __future__ import annotations

import gc
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

import psutil
import torch
from torch import nn

from gpu.sizes import device_bytes
from mas.config import Settings
from mas.errors import PermanentError

GIB = 2**30
HOST_HEADROOM_BYTES = 4 * GIB
"""Host memory left free when parking an evicted model: room for the worker itself, decoding and the next load."""


class Placeable(Protocol):
    """What the manager holds: a torch module, or a diffusers pipeline (whose `components` hold modules)."""

    def to(self, device: Any) -> Any: ...


M = TypeVar("M", bound=Placeable)


class ModelTooLarge(PermanentError):
    """A model that cannot fit in the VRAM budget even with every other model evicted."""

    def __init__(self, *, key: str, size_bytes: int, budget_bytes: int) -> None:
        super().__init__(
            f"model {key!r} needs {size_bytes / GIB:.2f} GiB but the VRAM budget is {budget_bytes / GIB:.2f} GiB; "
            "raise MAS_VRAM_BUDGET_GB, or set MAS_DIFFUSERS_OFFLOAD / MAS_DIFFUSERS_FP8 (`mas gpu plan` says which fit)"
        )
        self.key, self.size_bytes, self.budget_bytes = key, size_bytes, budget_bytes


def model_parts(model: Placeable) -> list[nn.Module]:
    """The torch modules a model is made of: itself, or the module components of a pipeline."""
    if isinstance(model, nn.Module):
        return [model]
    components = getattr(model, "components", None)
    if isinstance(components, dict):
        return [part for part in components.values() if isinstance(part, nn.Module)]
    raise TypeError(f"cannot measure a {type(model).__name__}; pass size_bytes")


@dataclass(kw_only=True)
class _Entry:
    model: Placeable
    size_bytes: int
    offloaded: bool  # the model moves its own parts on and off the device


@dataclass(frozen=True, kw_only=True)
class ResidencyStats:
    """Counters since the manager was created, and what is held now."""

    loads: int  # models built by their loader (from disk)
    swaps: int  # parked models brought back onto the device
    evictions: int  # models moved off the device to make room (parked or dropped)
    drops: int  # evictions that released the model entirely (it did not fit in host memory)
    hits: int  # requests answered by a model already on the device
    resident: tuple[str, ...]  # keys on the device, least recently used first
    resident_bytes: int
    parked: tuple[str, ...]  # keys evicted to host memory, ready to swap back
    parked_bytes: int
    budget_bytes: int | None  # None: unlimited


class Residency:
    """Keeps models on `device` between tasks, evicting the least recently used ones beyond `budget_bytes`.

    `budget_bytes=None` means unlimited (a CPU device with no configured budget). `host_budget_bytes` caps the
    memory parked models may take on the host; None means whatever the host has available, less
    `HOST_HEADROOM_BYTES`. `on_before_load(key)` runs before a model is brought onto the device (a first load
    or a swap back), for instance to ask a ComfyUI server sharing the GPU to free its memory.
    """

    def __init__(
        self,
        *,
        budget_bytes: int | None,
        device: torch.device | str,
        host_budget_bytes: int | None = None,
        on_before_load: Callable[[str], None] | None = None,
    ) -> None:
        self.budget_bytes = budget_bytes
        self.device = torch.device(device)
        self.host_budget_bytes = host_budget_bytes
        self.on_before_load = on_before_load
        self._resident: OrderedDict[str, _Entry] = OrderedDict()
        self._parked: dict[str, _Entry] = {}
        self._loads = self._swaps = self._evictions = self._drops = self._hits = 0

    def get(self, key: str, *, loader: Callable[[], M], size_bytes: int | None = None, offload: str = "none") -> M:
        """The model stored under `key`, on the device; `loader()` builds it (on any device) on first need.

        `size_bytes` is what the model takes on the device; measured from its parameters and buffers when
        not given, under `offload`: a model that moves its own parts onto the device while it runs (model: one
        whole part at a time; group, sequential: leaf modules) is charged what it keeps there at most
        (`gpu.sizes.device_bytes`), and the manager never moves it.
        """
        if (entry := self._resident.get(key)) is not None:
            self._resident.move_to_end(key)
            self._hits += 1
            return cast(M, entry.model)
        if (entry := self._parked.pop(key, None)) is not None:
            self._make_room(key=key, size_bytes=entry.size_bytes)
            self._before_load(key)
            self._place(entry, self.device)
            self._resident[key] = entry
            self._swaps += 1
            return cast(M, entry.model)
        if size_bytes is not None:  # known: make room first, in case the loader fills the device itself
            self._make_room(key=key, size_bytes=size_bytes)
        self._before_load(key)
        model = loader()
        if size_bytes is None:
            size_bytes = device_bytes(model_parts(model), offload)
            self._make_room(key=key, size_bytes=size_bytes)
        entry = _Entry(model=model, size_bytes=size_bytes, offloaded=offload != "none")
        self._place(entry, self.device)
        self._resident[key] = entry
        self._loads += 1
        return model

    def stats(self) -> ResidencyStats:
        return ResidencyStats(
            loads=self._loads,
            swaps=self._swaps,
            evictions=self._evictions,
            drops=self._drops,
            hits=self._hits,
            resident=tuple(self._resident),
            resident_bytes=sum(e.size_bytes for e in self._resident.values()),
            parked=tuple(self._parked),
            parked_bytes=sum(e.size_bytes for e in self._parked.values()),
            budget_bytes=self.budget_bytes,
        )

    def _before_load(self, key: str) -> None:
        if self.on_before_load is not None:
            self.on_before_load(key)

    def _check_fits(self, *, key: str, size_bytes: int) -> None:
        if self.budget_bytes is not None and size_bytes > self.budget_bytes:
            raise ModelTooLarge(key=key, size_bytes=size_bytes, budget_bytes=self.budget_bytes)

    def _make_room(self, *, key: str, size_bytes: int) -> None:
        """Evict least recently used models until `size_bytes` more fit in the budget."""
        if self.budget_bytes is None:
            return
        self._check_fits(key=key, size_bytes=size_bytes)
        used = sum(e.size_bytes for e in self._resident.values())
        evicted = False
        while used + size_bytes > self.budget_bytes:
            old_key, old = self._resident.popitem(last=False)
            used -= old.size_bytes
            self._evictions += 1
            evicted = True
            if self._fits_on_host(old.size_bytes):
                self._place(old, torch.device("cpu"))
                self._parked[old_key] = old
            else:
                self._drops += 1
        if evicted:
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()  # hand the memory back, so a process sharing the GPU can use it

    def _fits_on_host(self, size_bytes: int) -> bool:
        parked = sum(e.size_bytes for e in self._parked.values())
        if self.host_budget_bytes is not None:
            return parked + size_bytes <= self.host_budget_bytes
        return size_bytes <= psutil.virtual_memory().available - HOST_HEADROOM_BYTES

    @staticmethod
    def _place(entry: _Entry, device: torch.device) -> None:
        if not entry.offloaded:
            entry.model.to(device)


def worker_device(configured: str = "") -> torch.device:
    """The gpu worker's device: the one configured (MAS_GPU_DEVICE, e.g. cuda:1), else the first CUDA
    device when there is one, else the CPU."""
    if configured:
        return torch.device(configured)
    return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")


def budget_of(settings: Settings, device: torch.device) -> int | None:
    """MAS_VRAM_BUDGET_GB (GiB) when set; else the CUDA device's total memory; on a CPU, unlimited."""
    if settings.gpu.vram_budget_gb > 0:
        return int(settings.gpu.vram_budget_gb * GIB)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return None
