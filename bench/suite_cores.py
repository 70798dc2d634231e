"""Where the suite's processor time goes: a pytest plugin that charges each test the machine's busy core-seconds.

The suite's goal (15 minutes on 2 cores) is bound by the processor's work, and most of that work is in processes
the tests start (servers, workers, `mas` commands), which a profiler of the test process does not see. The
kernel's counters do: the busy core-seconds of the whole machine between a test's setup and its teardown are
charged to it. Meaningful in one process on an otherwise idle machine only.

    python -m pytest -q -p no:cacheprovider -p bench.suite_cores [tests...]   # writes .test-artifacts/suite-cores.json
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path

import pytest

OUT = Path(".test-artifacts") / "suite-cores.json"
TICKS = os.sysconf("SC_CLK_TCK")


def _busy_seconds() -> float:
    """Busy core-seconds of the whole machine since boot: user, nice, system, irq and softirq (not idle, iowait,
    or steal, the time a hypervisor gave another guest)."""
    user, nice, system, _idle, _iowait, irq, softirq = (
        int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]
    )
    return (user + nice + system + irq + softirq) / TICKS


class CoreSeconds:
    def __init__(self) -> None:
        self.tests: dict[str, dict[str, float]] = defaultdict(lambda: {"wall": 0.0, "busy": 0.0})
        self.started = (time.monotonic(), _busy_seconds())

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):  # noqa: ARG002 (pytest's hook signature)
        wall, busy = time.monotonic(), _busy_seconds()
        yield
        entry = self.tests[item.nodeid]
        entry["wall"] += time.monotonic() - wall
        entry["busy"] += _busy_seconds() - busy

    def pytest_sessionfinish(self) -> None:
        wall, busy = time.monotonic() - self.started[0], _busy_seconds() - self.started[1]
        modules: dict[str, dict[str, float]] = defaultdict(lambda: {"wall": 0.0, "busy": 0.0, "tests": 0})
        for nodeid, entry in self.tests.items():
            module = modules[nodeid.split("::", 1)[0]]
            module["wall"] += entry["wall"]
            module["busy"] += entry["busy"]
            module["tests"] += 1
        OUT.parent.mkdir(exist_ok=True)
        OUT.write_text(
            json.dumps(
                {
                    "wall": wall,
                    "busy": busy,
                    "cores": os.cpu_count(),
                    "modules": dict(sorted(modules.items(), key=lambda kv: -kv[1]["busy"])),
                    "tests": dict(sorted(self.tests.items(), key=lambda kv: -kv[1]["busy"])),
                },
                indent=1,
            )
        )


def pytest_configure(config) -> None:
    config.pluginmanager.register(CoreSeconds(), "suite-core-seconds")
