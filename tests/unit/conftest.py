"""The fast tier: tests of pure code (rules, parsing, plans, settings, the step table, the state machine) that
start no server and run in under a minute: `python -m pytest tests/unit`. A test here that asks for a
fixture that starts one (PostgreSQL, Redis, a worker, a studio) is refused at collection: it belongs in
tests/integration (PostgreSQL and Redis in process) or tests/system (worker processes, other servers)."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SERVERS = frozenset(
    {"settings", "engine", "clean", "workers", "studio", "studio_env", "letta_server", "letta_settings"}
)
"""The shared fixtures that start servers or processes (tests/conftest.py and its neighbours)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:  # noqa: ARG001
    wrong = [
        f"{item.nodeid} uses {', '.join(sorted(SERVERS & set(item.fixturenames)))}"
        for item in items
        if HERE in Path(str(item.fspath)).resolve().parents and SERVERS & set(getattr(item, "fixturenames", ()))
    ]
    if wrong:
        raise pytest.UsageError("a fast test starts no server:\n" + "\n".join(wrong))
