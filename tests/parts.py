"""Parts a test needs that the machine may lack (a system program, root), and one rule for them: a test
whose part is missing skips with the reason, or fails where `MAS_TEST_REQUIRE_<PART>=1` says the part was
installed (CI sets every switch, so a missing part fails CI rather than passing it unseen).

    need("PROMETHEUS", None if shutil.which("prometheus") else "the prometheus server is not installed")
"""

from __future__ import annotations

import os

import pytest

PARTS = ("HOSTS", "PROMETHEUS", "CHROMIUM", "COMPOSE", "TLS", "S3", "LETTA", "LLM", "COMFYUI")
"""Each part's switch is MAS_TEST_REQUIRE_<PART>."""


def required(part: str) -> bool:
    if part not in PARTS:
        raise ValueError(f"unknown part {part!r}; one of {', '.join(PARTS)}")
    return os.environ.get(f"MAS_TEST_REQUIRE_{part}") == "1"


def need(part: str, reason: str | None, *, module: bool = False) -> None:
    """Nothing when `reason` is None (the part is here); else skip the test, or fail it where the part is
    required. `module`: called at a module's top (skips or fails the whole module)."""
    if reason is None:
        return
    if required(part):
        pytest.fail(f"MAS_TEST_REQUIRE_{part}=1 but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=module)
