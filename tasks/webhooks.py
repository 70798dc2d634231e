"""Webhook delivery on the cpu queue, sent by beat every MAS_WEBHOOK_EVERY_SECONDS (beat_schedule.py)."""

from __future__ import annotations

import time

from celery import shared_task

from mas import names
from mas.outbox import webhooks

ROUNDS = 100
"""Rounds one run may do: a batch's next event is due once the one before it is delivered, so a receiver
that answers gets a batch's events in one run, one round each."""

BUDGET_S = 60.0
"""No new round starts after this long: the rest waits for beat's next run, and the worker's process goes
back to the pipeline."""


# No retries of its own (a database that is away included): beat sends the next run in a moment, and a
# run's claims lapse by themselves.
@shared_task(name=names.DELIVER_WEBHOOKS, bind=True, autoretry_for=(), max_retries=0)
def deliver(self) -> dict:
    """Deliver the due webhook events round after round, until nothing is due or the budget is spent."""
    settings = self.app.settings
    total = webhooks.DeliveryReport()
    deadline = time.monotonic() + BUDGET_S
    for _ in range(ROUNDS):
        report = webhooks.deliver_due(settings)
        total.add(report)
        if not report.tried or time.monotonic() > deadline:
            break
    return {"delivered": len(total.delivered), "retrying": len(total.retrying), "failed": len(total.failed)}
