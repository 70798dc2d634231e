"""Events for other programs: which wait to be delivered and which were given up."""

from __future__ import annotations

from datetime import datetime

import click

from mas.cli.context import LIMIT, console, ready
from mas.cli.output import print_whole
from mas.config import Settings
from mas.redaction import redact_url


@click.command()
@click.option("--limit", type=LIMIT, default=50, show_default=True, help="Events shown of each kind.")
@click.pass_obj
def webhooks(settings: Settings, limit: int) -> None:
    """Webhook events pending (not delivered yet) or failed (given up after MAS_WEBHOOK_MAX_ATTEMPTS tries).

    One line each, whole: its id (the `webhook-id` a receiver sees), type, batch, receiver, tries, when it is
    tried next (or was given up) and its last error. Delivered events are not shown.
    """
    from mas.outbox.webhooks import failed, pending

    ready(settings)
    waiting, given_up = pending(settings, limit=limit), failed(settings, limit=limit)
    if not waiting and not given_up:
        console.print("no webhook events pending or failed")
        return
    console.print(f"pending: {len(waiting)}{'+' if len(waiting) == limit else ''}")
    for event in waiting:
        print_whole(_line(event, "next try", event.next_attempt_at))
    console.print(f"failed: {len(given_up)}{'+' if len(given_up) == limit else ''}")
    for event in given_up:
        print_whole(_line(event, "given up", event.failed_at))


def _line(event, when: str, at: datetime | None) -> str:
    shown = f"{at.astimezone():%Y-%m-%d %H:%M:%S}" if at else "-"
    return (
        f"  {event.id} {event.type} batch {event.batch_id or '-'} to {redact_url(event.url)}: "
        f"{event.attempts} tries, {when} {shown}, last error: {event.last_error or '-'}"
    )


COMMANDS = [webhooks]
