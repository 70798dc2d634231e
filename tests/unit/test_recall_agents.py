"""The recall buffers' agents and their sleeptime twins. Pure code: no server."""

from __future__ import annotations

import pytest

from mas.memory import recall


def test_agents_and_sleeptime():
    assert len(recall.AGENTS) == 6
    assert [a for a in recall.AGENTS if recall.is_sleeptime(a)] == [
        "director_sleeptime",
        "writer_sleeptime",
        "cameraman_sleeptime",
    ]
    with pytest.raises(ValueError, match="unknown agent 'editor'"):
        recall.is_sleeptime("editor")
