"""How a video lives and ends, and how a batch does: the states the step table and the state machine speak of."""

from __future__ import annotations

import enum


class VideoState(str, enum.Enum):
    """Life of one video. A live state names the pipeline step that is due or running for the video's current
    attempt (`mas.domain.steps`); the final ones say how it ended."""

    waiting = "waiting"  # planned; written when the GPUs need another prompt (`mas.pipeline.pacing`)
    writing = "writing"
    rendering = "rendering"
    grading = "grading"
    reviewing = "reviewing"
    accepted = "accepted"
    failed = "failed"
    cancelled = "cancelled"  # stopped by `mas cancel`: final, nothing brings it back


class BatchStatus(str, enum.Enum):
    queued = "queued"
    running = "running"
    paused = "paused"  # no new step starts until `mas continue`
    done = "done"
    failed = "failed"  # planning failed for good; `failure_reason` says why
    cancelled = "cancelled"


TERMINAL = frozenset({VideoState.accepted, VideoState.failed, VideoState.cancelled})
"""The final states: a video in one goes nowhere."""
