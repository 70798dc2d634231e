"""Periodic upkeep on the cpu queue (scheduled by beat_schedule.py)."""

from dataclasses import asdict

from celery import shared_task

from mas import names
from mas.memory import recall
from mas.outbox import eventlog
from mas.pipeline import production, rows
from mas.pipeline.outcomes import LOST_CONNECTION
from mas.runtime.app import StudioTask
from tasks import recovery

BUFFERS_JOB = "buffers"
"""Buffer maintenance in `mas.pipeline.rows`: one agent's buffer that cannot be maintained is marked, then parked."""


@shared_task(name=names.MAINTAIN_BUFFERS, bind=True)
def maintain_buffers(self) -> list[dict]:
    """Maintenance v3 on every agent's message buffer: summarize at WARN, reset at CRITICAL/EMERGENCY.

    The studio's own buffers always, one at a time (a buffer that fails is marked and skipped); the agents on
    the Letta server too when that backend is on.
    """
    settings = self.app.settings
    ran = rows.each(settings, BUFFERS_JOB, recall.known(settings), lambda agent: recall.maintain_agent(settings, agent))
    actions = list(ran.done.values())
    if settings.agents.backend == "letta":  # one Letta agent failing never stops the others there either
        from mas.agents.letta import maintain

        actions += maintain(settings)
    return [asdict(action) for action in actions]


# A stale broker connection (Redis restarted, a network cut healed) fails an inspection of the workers:
# tried again on a fresh one, not reported as an error.
AGAIN_ON_LOST_CONNECTION = {
    "autoretry_for": (*StudioTask.autoretry_for, *LOST_CONNECTION),
    "retry_backoff": 1,
    "retry_backoff_max": 5,
    "max_retries": 5,
}


@shared_task(name=names.RECONCILE, bind=True, **AGAIN_ON_LOST_CONNECTION)
def reconcile(self) -> dict:
    """Re-send work Postgres says is unfinished but no message carries; skip videos stuck for too long."""
    settings = self.app.settings
    report = recovery.reconcile(settings, older_than=settings.reliability.reconcile_after_seconds)
    return asdict(report)


@shared_task(name=names.RECOVER, bind=True, **AGAIN_ON_LOST_CONNECTION)
def recover(self) -> dict:
    """`mas recover`: re-send every unfinished video and queued batch that nothing carries, at once."""
    return asdict(recovery.reconcile(self.app.settings, older_than=0, unanswered=True))


@shared_task(name=names.RUN_SCHEDULES, bind=True)
def run_schedules(self) -> list[int]:
    """Enqueue the overnight batches whose time has come (each exactly once)."""
    return production.run_due_schedules(self.app.settings)


@shared_task(name=names.EXPIRE_IDEMPOTENCY_KEYS, bind=True)
def expire_idempotency_keys(self) -> int:
    """Delete the API's Idempotency-Keys older than MAS_IDEMPOTENCY_KEY_HOURS; how many."""
    from mas.api.idempotency import delete_expired  # the API's module, loaded only when this runs

    return delete_expired(self.app.settings)


@shared_task(name=names.EXPIRE_EVENTS, bind=True)
def expire_events(self) -> int:
    """Delete the event log's events older than MAS_EVENT_RETENTION_DAYS; how many."""
    return eventlog.delete_expired(self.app.settings)
