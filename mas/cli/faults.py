"""Rows a periodic job could not process: every one listed, and tried again once a person has seen to it."""

from __future__ import annotations

import click
from rich.table import Table
from rich.text import Text

from mas.cli.context import console, ready
from mas.cli.output import print_whole
from mas.config import Settings
from mas.text import visible


@click.group("faults")
def faults_group() -> None:
    """Rows a periodic job (schedules, webhooks, buffers, consolidation, ...) could not process: list, retry."""


@faults_group.command("list")
@click.pass_obj
def faults_list(settings: Settings) -> None:
    """Every row a job could not process: its job and key, its tries, failing (tried again later) or parked
    (after MAS_ROW_MAX_TRIES, until `mas faults retry`), and its error."""
    from mas.reports import queries

    ready(settings)
    found = queries.row_faults(settings, limit=None)
    if not found:
        console.print("no faults: every job processed every row")
        return
    table = Table("job", "row", "tries", "state", "error")
    for job, key, fault in found:
        state = "parked" if fault.parked else "failing"
        table.add_row(job, Text(visible(key)), str(fault.attempts), state, Text(visible(fault.error)))
    console.print(table)


@faults_group.command("retry")
@click.argument("job", required=False)
@click.argument("key", required=False)
@click.option("--all", "every", is_flag=True, help="every job's faults")
@click.pass_obj
def faults_retry(settings: Settings, job: str | None, key: str | None, every: bool) -> None:
    """Let JOB try its row KEY again at its next run (every row of JOB without KEY), parked or not: for after
    the row has been mended (`mas faults list` names them)."""
    from mas.pipeline import rows

    if (job is None) == (not every) or (every and key is not None):
        raise click.UsageError("name a job (and a row), or --all")
    ready(settings)
    released = rows.release(settings, job, key)
    if not released:
        raise click.ClickException(
            f"no fault of {' '.join(visible(p) for p in (job, key) if p)}: `mas faults list` shows them"
            if job
            else "no faults to retry"
        )
    for j, k in released:
        print_whole(f"{j} {visible(k)}: tried again at the job's next run")


COMMANDS = [faults_group]
