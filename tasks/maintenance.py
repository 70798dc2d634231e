"""Periodic upkeep on the cpu queue (scheduled by beat_schedule.py)."""

from dataclasses import asdict

from mas.celery_app import app
from mas.memory import recall


@app.task(name="tasks.maintenance.maintain_buffers", bind=True)
def maintain_buffers(self) -> list[dict]:
    """Maintenance v3 on every agent's message buffer: summarize at WARN, reset at CRITICAL/EMERGENCY."""
    return [asdict(action) for action in recall.maintain(self.app.settings)]
