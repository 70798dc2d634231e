"""The model residency manager, with real torch modules of known sizes and a small byte budget."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpu.factory import residency
from gpu.residency import GIB, ModelTooLarge, Residency, budget_of, model_parts
from gpu.sizes import module_bytes
from mas.config import Settings

LINEAR_BYTES = 16 * 16 * 4  # nn.Linear(16, 16, bias=False) in float32


class Loaders:
    """Builds small linear models on demand and remembers which were built."""

    def __init__(self) -> None:
        self.built: list[str] = []

    def __call__(self, key: str, features: int = 16):
        def load() -> nn.Module:
            self.built.append(key)
            return nn.Linear(features, features, bias=False)

        return load


def fetch(manager: Residency, loaders: Loaders, *keys: str) -> None:
    for key in keys:
        manager.get(key, loader=loaders(key))


def test_module_bytes_counts_parameters_and_buffers_once():
    assert module_bytes(nn.Linear(10, 20)) == (10 * 20 + 20) * 4
    assert module_bytes(nn.BatchNorm1d(8)) == (8 + 8) * 4 + (8 + 8) * 4 + 8  # weight, bias; running stats; count
    shared = nn.Linear(16, 16, bias=False)
    assert module_bytes(nn.Sequential(shared, shared)) == LINEAR_BYTES
    assert module_bytes(nn.Linear(16, 16, bias=False).to(torch.float16)) == LINEAR_BYTES // 2
    with pytest.raises(TypeError, match="size_bytes"):
        model_parts(object())  # type: ignore[arg-type]


def test_models_stay_resident_and_the_least_recently_used_is_evicted():
    loaders = Loaders()
    manager = Residency(budget_bytes=2 * LINEAR_BYTES, device="cpu")
    fetch(manager, loaders, "a", "b", "a")  # "a" is now the most recently used
    assert loaders.built == ["a", "b"]
    fetch(manager, loaders, "c")  # no room: "b" goes
    stats = manager.stats()
    assert stats.resident == ("a", "c") and stats.parked == ("b",)
    assert (stats.loads, stats.hits, stats.evictions, stats.swaps, stats.drops) == (3, 1, 1, 0, 0)
    assert stats.resident_bytes == 2 * LINEAR_BYTES and stats.parked_bytes == LINEAR_BYTES
    assert stats.budget_bytes == 2 * LINEAR_BYTES


def test_a_parked_model_swaps_back_without_loading_again():
    loaders = Loaders()
    manager = Residency(budget_bytes=2 * LINEAR_BYTES, device="cpu")
    fetch(manager, loaders, "a", "b")
    first_b = manager.get("b", loader=loaders("b"))
    fetch(manager, loaders, "c")  # parks "a"
    fetch(manager, loaders, "a")  # swaps "a" back, parks "b"
    assert loaders.built == ["a", "b", "c"]
    fetch(manager, loaders, "b")
    assert manager.get("b", loader=loaders("b")) is first_b
    stats = manager.stats()
    assert (stats.loads, stats.swaps, stats.evictions) == (3, 2, 3)
    assert stats.resident == ("a", "b") and stats.parked == ("c",)


def test_models_that_do_not_fit_in_host_memory_are_dropped_and_loaded_again():
    loaders = Loaders()
    manager = Residency(budget_bytes=LINEAR_BYTES, device="cpu", host_budget_bytes=0)
    fetch(manager, loaders, "a", "b", "a")
    stats = manager.stats()
    assert loaders.built == ["a", "b", "a"]
    assert (stats.loads, stats.swaps, stats.evictions, stats.drops) == (3, 0, 2, 2)
    assert stats.resident == ("a",) and stats.parked == ()


def test_host_budget_limits_parked_models():
    loaders = Loaders()
    manager = Residency(budget_bytes=LINEAR_BYTES, device="cpu", host_budget_bytes=LINEAR_BYTES)
    fetch(manager, loaders, "a", "b", "c")  # "a" parks; "b" no longer fits on the host
    stats = manager.stats()
    assert stats.parked == ("a",) and stats.resident == ("c",)
    assert (stats.evictions, stats.drops) == (2, 1)


def test_on_before_load_runs_before_loads_and_swaps_not_hits():
    loaders = Loaders()
    calls: list[tuple[str, list[str]]] = []
    manager = Residency(
        budget_bytes=LINEAR_BYTES, device="cpu", on_before_load=lambda key: calls.append((key, list(loaders.built)))
    )
    fetch(manager, loaders, "a", "a", "b", "a")
    # load "a" (before its loader ran), load "b", swap "a" back; the hit on "a" calls nothing
    assert calls == [("a", []), ("b", ["a"]), ("a", ["a", "b"])]


def test_a_model_larger_than_the_budget_is_refused_clearly():
    loaders = Loaders()
    manager = Residency(budget_bytes=LINEAR_BYTES, device="cpu")
    with pytest.raises(ModelTooLarge, match=r"'big' needs .* GiB but the VRAM budget is .*MAS_VRAM_BUDGET_GB"):
        manager.get("big", loader=loaders("big"), size_bytes=2 * LINEAR_BYTES)
    assert loaders.built == []  # refused before loading
    with pytest.raises(ModelTooLarge) as measured:
        manager.get("wide", loader=loaders("wide", features=32))
    assert measured.value.size_bytes == 32 * 32 * 4
    assert manager.stats().resident == () and manager.stats().loads == 0


def test_given_sizes_are_charged_instead_of_measured():
    loaders = Loaders()
    manager = Residency(budget_bytes=10 * GIB, device="cpu", host_budget_bytes=6 * GIB)
    manager.get("a", loader=loaders("a"), size_bytes=6 * GIB)
    manager.get("b", loader=loaders("b"), size_bytes=6 * GIB)
    stats = manager.stats()
    assert stats.resident == ("b",) and stats.resident_bytes == 6 * GIB
    assert stats.parked == ("a",) and stats.parked_bytes == 6 * GIB


def test_without_a_budget_nothing_is_evicted():
    loaders = Loaders()
    manager = Residency(budget_bytes=None, device="cpu")
    fetch(manager, loaders, *"abcdef")
    assert manager.stats().resident == tuple("abcdef") and manager.stats().evictions == 0


def test_budget_comes_from_settings_and_the_instance_is_process_wide():
    cpu = torch.device("cpu")
    assert budget_of(Settings(vram_budget_gb=1.5), cpu) == int(1.5 * GIB)
    assert budget_of(Settings(vram_budget_gb=0), cpu) is None
    settings = Settings()
    assert residency(settings) is residency(settings)
