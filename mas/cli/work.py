"""Putting work in: requests, series, A/B tests and picks, resumed and scheduled batches, recovery."""

from __future__ import annotations

from datetime import datetime, timedelta

import click
from rich.table import Table
from rich.text import Text

from mas.cli.context import ID, USER, console, ready
from mas.cli.output import print_block, print_whole
from mas.cli.watching import follow_batch
from mas.config import Settings
from mas.domain.identity import Actor
from mas.domain.requests import MAX_VARIATIONS, ProductionRequest, parse_request
from mas.errors import InvalidInput
from mas.names import PRIORITIES
from mas.text import visible

PRIORITY = click.option(
    "--priority",
    type=click.Choice(list(PRIORITIES)),
    default=None,
    help="high: to the GPU ahead of waiting batch work (default: normal; A/B tests MAS_AB_PRIORITY).",
)

NOTIFY = click.option(
    "--notify",
    "notify_url",
    metavar="URL",
    default=None,
    help="Also send this batch's events to URL (signed with MAS_WEBHOOK_SECRET; see `mas webhooks`).",
)


@click.command()
@click.argument("request")
@click.option("--wait", is_flag=True, help="Follow the batch until every video is done.")
@click.option("--at", "at", default=None, metavar="HH:MM", help="Start at this local time (next occurrence).")
@PRIORITY
@NOTIFY
@USER
@click.pass_obj
def enqueue(
    settings: Settings,
    actor: Actor,
    request: str,
    wait: bool,
    at: str | None,
    priority: str | None,
    notify_url: str | None,
) -> None:
    """Queue a production request, e.g. "Create 10 videos of mythical creatures"."""
    from mas.pipeline import production

    parsed = parse_request(request, settings)
    if at is None:
        _submit(settings, actor, parsed, wait=wait, priority=priority, notify_url=notify_url)
        return
    run_at = _next_time(at)
    ready(settings)
    schedule_id = production.schedule(settings, actor, parsed, run_at=run_at, priority=priority, notify_url=notify_url)
    console.print(
        f"schedule {schedule_id}: {request!r} starts at {run_at.astimezone():%Y-%m-%d %H:%M %Z} (needs beat: `mas run`)"
    )


def _next_time(text: str) -> datetime:
    """The next local occurrence of HH:MM, as an aware datetime; anything else is refused in one line."""
    try:
        hour, minute = (int(part) for part in text.split(":"))
    except ValueError:
        hour = minute = -1
    if not (0 <= hour <= 23 and 0 <= minute <= 59):
        raise InvalidInput(f"--at wants a time as HH:MM (24 h), got {text!r}")
    now = datetime.now().astimezone()
    run_at = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
    return run_at if run_at > now else run_at + timedelta(days=1)


def _submit(
    settings: Settings,
    actor: Actor,
    request: ProductionRequest,
    *,
    wait: bool,
    priority: str | None,
    notify_url: str | None,
) -> None:
    """Queue `request` (read before anything starts, so a bad one changes nothing); follow it if asked."""
    from mas.pipeline import production

    ready(settings)
    batch_id = production.submit(settings, actor, request, priority=priority, notify_url=notify_url)
    shown = production.priority_for(settings, request, priority)
    console.print(f"batch {batch_id}: {request.count} x {request.kind} of {request.theme!r} queued ({shown} priority)")
    if wait:
        follow_batch(settings, batch_id)


@click.command()
@click.argument("name")
@click.option("--episodes", type=click.IntRange(1, 100_000), default=3, show_default=True, help="Episodes to make now.")
@click.option("--wait", is_flag=True, help="Follow the batch until it is done.")
@PRIORITY
@NOTIFY
@USER
@click.pass_obj
def series(
    settings: Settings, actor: Actor, name: str, episodes: int, wait: bool, priority: str | None, notify_url: str | None
) -> None:
    """Make (or continue) a series: episodes keep its style and consistency rules across sessions."""
    request = ProductionRequest.series(name, episodes=episodes, settings=settings)
    _submit(settings, actor, request, wait=wait, priority=priority, notify_url=notify_url)


@click.command()
@click.argument("concept")
@click.option("--variations", type=click.IntRange(2, MAX_VARIATIONS), default=3, show_default=True)
@click.option("--wait", is_flag=True, help="Follow the batch until it is done.")
@PRIORITY
@NOTIFY
@USER
@click.pass_obj
def ab(
    settings: Settings,
    actor: Actor,
    concept: str,
    variations: int,
    wait: bool,
    priority: str | None,
    notify_url: str | None,
) -> None:
    """Render variations of one concept; then choose the winner with `mas pick TEST LABEL`."""
    request = ProductionRequest.ab(concept, variations=variations, settings=settings)
    _submit(settings, actor, request, wait=wait, priority=priority, notify_url=notify_url)


@click.command()
@click.argument("test", type=ID)
@click.argument("label")
@USER
@click.pass_obj
def pick(settings: Settings, actor: Actor, test: int, label: str) -> None:
    """Choose the winning variation of A/B test TEST (label A, B, ...)."""
    from mas.learning import preferences
    from mas.reports import queries

    ready(settings)
    value = preferences.pick(settings, actor, test, label)
    console.print(f"test {test}: {label.upper()} recorded as the winner for {actor.user}")
    console.print(queries.expectation(settings, test))
    print_block("ab_testing", value)


@click.command()
@click.option("--yes", is_flag=True, help="Resume without asking.")
@click.pass_obj
def resume(settings: Settings, yes: bool) -> None:
    """Offer and restart the work a previous session left pending."""
    from mas.pipeline import production
    from mas.reports import queries

    ready(settings)
    pending = queries.pending_work(settings)
    if not pending:
        console.print("nothing to resume: no pending work")
        return
    for work in pending:
        console.print(f"pending: batch {work['batch_id']}: {work['request']}")
    if not yes and not click.confirm("resume these now?", default=True):
        console.print("left pending")
        return
    production.resume(settings, [work["batch_id"] for work in pending])
    console.print(f"resumed {len(pending)} batch(es); follow with `mas status --follow`")


@click.group(name="schedule")
def schedule_group() -> None:
    """Overnight batches: list them, cancel one."""


@schedule_group.command("list")
@click.pass_obj
def schedule_list(settings: Settings) -> None:
    """Show scheduled, sent, cancelled and failed batches (a failed one: its user's quotas refused it when it
    ran; the reason follows the table), and the schedules that could not be run: failing (tried again later) or
    parked (after MAS_ROW_MAX_TRIES), each with its error."""
    from mas.reports import queries

    ready(settings)
    rows = queries.schedules(settings)
    if not rows:
        console.print('nothing scheduled: use `mas enqueue --at HH:MM "..."`')
        return
    table = Table("id", "runs at", "status", "batch", "request")
    for row in rows:
        status = (
            ("parked" if row.fault.parked else "failing") if row.fault and row.status == "scheduled" else row.status
        )
        table.add_row(str(row.id), row.runs_at(), status, str(row.batch_id or ""), Text(visible(row.request)))
    console.print(table)
    for row in rows:
        if row.failure_reason:
            print_whole(f"schedule {row.id} failed: {row.failure_reason}")
        if row.fault:
            print_whole(f"schedule {row.id} {row.fault.text()}")


@schedule_group.command("cancel")
@click.argument("schedule_id", type=ID)
@click.pass_obj
def schedule_cancel(settings: Settings, schedule_id: int) -> None:
    """Cancel a scheduled batch that has not started."""
    from mas.pipeline import production

    ready(settings)
    if not production.cancel_schedule(settings, schedule_id):
        raise click.ClickException(
            f"no pending schedule {schedule_id} (already run, cancelled or unknown); nothing changed"
        )
    console.print(f"schedule {schedule_id} cancelled")


@click.command()
@click.pass_obj
def recover(settings: Settings) -> None:
    """Rebuild the queues from Postgres after the broker lost its data (safe to run any time).

    Runs on a cpu worker, which sees what every worker holds; start one first if none runs.
    """
    from mas.runtime import remote

    ready(settings)
    report = remote.request_recover(settings)
    if report["taken_over"]:
        console.print(
            f"took over the steps of video(s) {', '.join(map(str, report['taken_over']))}: their worker does "
            "not answer (killed, or cut off)"
        )
    console.print(
        f"re-planned {len(report['replanned'])} batch(es), re-sent {len(report['resent'])} video(s), let "
        f"{len(report['released'])} waiting video(s) through; anything still queued was left alone"
    )
    for line in report["running"]:
        console.print(f"still running on a live worker, left alone: {line}", markup=False)


COMMANDS = [enqueue, series, ab, pick, resume, schedule_group, recover]
