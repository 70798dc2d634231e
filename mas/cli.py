"""The `mas` command line: run the studio, put work in, watch it.

Errors are one clear line and a non-zero exit; nothing is written when input is refused.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import sys
import time

import click
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from mas import services
from mas.config import Settings

console = Console()


def _fail(message: str) -> None:
    raise click.ClickException(message)


def _load_settings() -> Settings:
    try:
        return Settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        where = f"MAS_{field.upper()}" if field else "settings"
        _fail(f"invalid {where}: {first['msg']}")


def _ready(settings: Settings) -> None:
    """Start the embedded services if they are ours, then check and migrate the database."""
    from mas import db

    try:
        services.up(settings)
        db.ready_engine(settings)
    except (services.ServiceError, db.DatabaseUnavailable) as exc:
        _fail(str(exc))


class StudioGroup(click.Group):
    """Loads settings once for every command and turns known errors into one line."""

    def invoke(self, ctx):
        from mas.db import DatabaseUnavailable

        try:
            return super().invoke(ctx)
        except (DatabaseUnavailable, services.ServiceError) as exc:
            raise click.ClickException(str(exc)) from exc


@click.group(cls=StudioGroup)
@click.pass_context
def main(ctx: click.Context) -> None:
    """mas: an autonomous multi-agent AI video studio.

    Start here:  mas up  ->  mas worker --queue cpu / --queue gpu  ->  mas enqueue "Create 3 videos of dragons"
    """
    ctx.obj = _load_settings()


# --- services -------------------------------------------------------------------------------------


@main.command()
@click.pass_obj
def up(settings: Settings) -> None:
    """Start the embedded PostgreSQL and Redis (if no URLs are set) and apply migrations."""
    _ready(settings)
    _print_services(settings)


@main.command()
@click.pass_obj
def down(settings: Settings) -> None:
    """Stop the embedded PostgreSQL and Redis."""
    stopped = services.down(settings)
    console.print(f"stopped: {', '.join(stopped)}" if stopped else "nothing embedded was running")


@main.command(name="services")
@click.pass_obj
def services_cmd(settings: Settings) -> None:
    """Show which services are used, where, and whether they answer."""
    _print_services(settings)


def _print_services(settings: Settings) -> None:
    table = Table("service", "mode", "running", "url", "pid", "data")
    for info in services.describe(settings):
        table.add_row(
            info.name, info.mode, "yes" if info.running else "no", info.url, str(info.pid or ""), info.data
        )
    console.print(table)


# --- processes ------------------------------------------------------------------------------------


def _exec_celery(args: list[str]) -> None:
    """Replace this process with celery, so signals and exit codes are the worker's own."""
    celery = shutil.which("celery") or sys.executable
    argv = [celery, *args] if celery != sys.executable else [sys.executable, "-m", "celery", *args]
    sys.stdout.flush()
    os.execvp(argv[0], argv)


@main.command()
@click.option("--queue", type=click.Choice(["cpu", "gpu"]), required=True, help="Which queue to consume.")
@click.option("--concurrency", type=int, default=None, help="cpu processes (gpu is always 1).")
@click.option("--loglevel", default="INFO", show_default=True)
@click.option("--name", default=None, help="Worker node name (default QUEUE@hostname).")
@click.pass_obj
def worker(settings: Settings, queue: str, concurrency: int | None, loglevel: str, name: str | None) -> None:
    """Start a worker. A gpu worker runs one task at a time, fetches one at a time, acks late."""
    _ready(settings)
    procs = 1 if queue == "gpu" else (concurrency or settings.cpu_concurrency)
    _exec_celery(
        ["-A", "mas", "worker", "-Q", queue, "-c", str(procs), "--prefetch-multiplier", "1",
         "-n", name or f"{queue}@%h", "-l", loglevel, "-E"]
    )


@main.command()
@click.option("--loglevel", default="INFO", show_default=True)
@click.pass_obj
def beat(settings: Settings, loglevel: str) -> None:
    """Start Celery beat with the schedule of beat_schedule.py."""
    _ready(settings)
    schedule_file = settings.data_dir.resolve() / "celerybeat-schedule"
    _exec_celery(["-A", "beat_schedule:app", "beat", "-l", loglevel, "-s", str(schedule_file)])


@main.command()
@click.option("--address", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", default=5555, show_default=True)
@click.pass_obj
def flower(settings: Settings, address: str, port: int) -> None:
    """Start Flower. Beyond loopback it requires MAS_FLOWER_USER and MAS_FLOWER_PASSWORD."""
    auth = None
    if settings.flower_user and settings.flower_password:
        auth = f"{settings.flower_user}:{settings.flower_password.get_secret_value()}"
    if auth is None and not _is_loopback(address):
        _fail(f"refusing to serve Flower on {address} without auth: set MAS_FLOWER_USER and MAS_FLOWER_PASSWORD")
    args = ["-A", "mas", "flower", f"--address={address}", f"--port={port}"]
    if auth:
        args.append(f"--basic-auth={auth}")
    _exec_celery(args)


def _is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


# --- work -----------------------------------------------------------------------------------------


@main.command()
@click.argument("request")
@click.option("--wait", is_flag=True, help="Follow the batch until every video is done.")
@click.pass_obj
def enqueue(settings: Settings, request: str, wait: bool) -> None:
    """Queue a production request, e.g. "Create 10 videos of mythical creatures"."""
    from mas.production import submit
    from mas.requests import RequestError, parse_request

    try:
        parsed = parse_request(request, settings)
    except RequestError as exc:
        _fail(str(exc))
    _ready(settings)
    batch_id = submit(settings, parsed)
    console.print(f"batch {batch_id}: {parsed.count} x {parsed.kind} of {parsed.theme!r} queued")
    if wait:
        _follow(settings, batch_id)


@main.command()
@click.argument("batch", type=int, required=False)
@click.option("--follow", is_flag=True, help="Keep showing progress until the batch is done.")
@click.pass_obj
def status(settings: Settings, batch: int | None, follow: bool) -> None:
    """Show a batch's progress (default: the latest batch)."""
    _ready(settings)
    if follow:
        _follow(settings, batch)
    else:
        _show_batch(settings, batch)


def _show_batch(settings: Settings, batch_id: int | None):
    from mas.production import batch_overview

    batch = batch_overview(settings, batch_id)
    if batch is None:
        _fail(f"no batch {batch_id}" if batch_id else "no batches yet: queue one with `mas enqueue`")
    console.print(_batch_table(batch))
    return batch


def _batch_table(batch) -> Table:
    done = sum(v.state.value in ("accepted", "failed") for v in batch.videos)
    table = Table(
        "video", "state", "attempts", "grade", "concept",
        title=f"batch {batch.id} [{batch.status.value}] {done}/{batch.total} done: {batch.request}",
    )
    for v in batch.videos:
        table.add_row(str(v.id), v.state.value, str(v.attempt_count), v.grade or "", v.concept)
    return table


def _follow(settings: Settings, batch_id: int | None, *, poll: float = 1.0) -> None:
    from rich.live import Live

    from mas.production import batch_overview

    batch = batch_overview(settings, batch_id)
    if batch is None:
        _fail(f"no batch {batch_id}" if batch_id else "no batches yet")
    with Live(_batch_table(batch), console=console, refresh_per_second=4) as live:
        while batch.status.value not in ("done", "cancelled"):
            time.sleep(poll)
            batch = batch_overview(settings, batch.id)
            live.update(_batch_table(batch))


if __name__ == "__main__":
    main()
