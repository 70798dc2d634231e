"""How an attempt of a video is sent: the chain of its steps, each to its queue at its priority.

Shared by the runner (the next attempt, videos let through after a render), planning, resume, reconcile,
control and the failure handler, none of which may import the others.
"""

from __future__ import annotations

from celery import Celery, chain
from celery.canvas import Signature

from mas.domain.steps import FIRST, Step, StepPayload, after, message_priority
from mas.names import Priority
from mas.pipeline import pacing
from mas.runtime.app import prioritized


def video_chain(app: Celery, payload: StepPayload, *, start: Step, priority: Priority) -> Signature:
    """The chain of one attempt of one video from `start` on. Each step hands the next the payload it was
    given. High-priority work goes to the urgent queues, first come, first served; other work waits in its
    queue by `message_priority` (finish what is started first)."""
    links = []
    for step in (start, *after(start)):
        signature: Signature = app.signature(step.task, args=(payload.to_json(),) if step is start else ())
        if priority != "high":
            grouped = app.settings.groups_gpu_work
            signature.set(priority=message_priority(step, payload.attempt, grouped=grouped))
        links.append(prioritized(app, signature, priority))
    return chain(*links)


def send_released(app: Celery, released: pacing.Released) -> None:
    """Start the videos `pacing.release` let through (after the transaction that moved them commits)."""
    for payload, priority in released:
        video_chain(app, payload, start=FIRST, priority=priority).apply_async()
