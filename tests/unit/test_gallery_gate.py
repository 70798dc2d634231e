"""The gallery's gate: which hosts are loopback. Pure code: no server."""

from __future__ import annotations

import pytest

from mas.config import is_loopback


@pytest.mark.parametrize(
    "host,loopback",
    [
        ("127.0.0.1", True),
        ("localhost", True),
        ("::1", True),
        ("127.0.0.2", True),
        ("0.0.0.0", False),
        ("example.com", False),
    ],
)
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback
