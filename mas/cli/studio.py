"""Running the studio: the services, each kind of process on its own, or everything at once (`mas run`)."""

from __future__ import annotations

import os
import sys

import click
from rich.table import Column, Table

from mas.cli.context import USER, console, load_settings, ready
from mas.cli.output import print_whole
from mas.config import Settings
from mas.domain.identity import Actor
from mas.gpu_rules import vram_plan
from mas.runtime import foreground, processes, services

PORT = click.IntRange(0, 65535)
"""A TCP port (0: any free one)."""

READY_HINT = (
    'Queue work from another terminal, e.g. mas enqueue --wait "Create 3 videos of dragons"; Ctrl-C stops it all.'
)


@click.command()
@click.option(
    "--concurrency",
    type=click.IntRange(1, 256),
    default=None,
    help="cpu worker processes (default MAS_CPU_CONCURRENCY).",
)
@click.option("--loglevel", default="INFO", show_default=True)
@click.option(
    "--grace",
    type=float,
    default=30.0,
    show_default=True,
    help="Seconds running tasks get to finish when stopping, before they are cut off.",
)
@click.pass_obj
def run(settings: Settings, concurrency: int | None, loglevel: str, grace: float) -> None:
    """Run the whole studio in this terminal: services, a cpu worker, a gpu worker and beat.

    Their logs are interleaved here, each line labelled; Ctrl-C stops them all.
    """
    vram_plan.check_fits(settings)
    ready(settings)
    foreground.run_studio(settings, concurrency=concurrency, loglevel=loglevel, grace_s=grace, ready_message=READY_HINT)
    if settings.embedded_database or settings.embedded_broker:
        console.print("postgres and redis keep running for other mas commands; `mas down` stops them", soft_wrap=True)


@click.command()
@click.pass_obj
def up(settings: Settings) -> None:
    """Start the embedded PostgreSQL and Redis (if no URLs are set) and apply migrations."""
    ready(settings)
    _print_services(settings)


@click.command()
@click.pass_obj
def down(settings: Settings) -> None:
    """Stop the embedded PostgreSQL and Redis."""
    stopped = services.down(settings)
    console.print(f"stopped: {', '.join(stopped)}" if stopped else "nothing embedded was running")


@click.command(name="services")
@click.pass_obj
def services_command(settings: Settings) -> None:
    """Show which services are used, where, and whether they answer."""
    _print_services(settings)


def _print_services(settings: Settings) -> None:
    infos = services.describe(settings)
    led = any(info.primary for info in infos)  # several servers: which one leads now
    table = Table("service", "mode", "running", Column("url", overflow="fold"), "pid", Column("data", overflow="fold"))
    if led:
        table.add_column("primary now")
    for info in infos:
        row = [info.name, info.mode, "yes" if info.running else "no", info.url, str(info.pid or ""), info.data]
        table.add_row(*row, *([info.primary] if led else []))
    console.print(table)
    if settings.agents.backend != "offline" and all(info.running for info in infos if info.name == "postgres"):
        from mas import db
        from mas.reports.queries import model_unusable_lately

        db.find(settings, start=False)  # the agent calls' record: is the model of any use
        if unusable := model_unusable_lately(settings):
            print_whole(f"agents: {unusable}")


def _exec(argv: list[str]) -> None:
    """Replace this process with `argv`, so signals and the exit status are that process's own."""
    sys.stdout.flush()
    os.execv(argv[0], argv)


@click.command()
@click.option(
    "--queue",
    type=click.Choice(["cpu", "gpu"]),
    required=True,
    help="Which work to take: cpu (agent steps) or gpu (renders and gradings, queues gpu, gpu-grade, gpu-urgent).",
)
@click.option(
    "--concurrency", type=click.IntRange(1, 256), default=None, help="cpu processes (default MAS_CPU_CONCURRENCY)."
)
@click.option("--loglevel", default="INFO", show_default=True)
@click.option(
    "--name", default=None, help="Worker node name (default cpu@hostname, gpu@hostname or gpu-cudaN@hostname)."
)
@click.option("--device", default=None, metavar="cuda:N", help="gpu: this worker's GPU (one gpu worker per GPU).")
@click.option("--comfyui-url", default=None, metavar="URL", help="gpu: this worker's own ComfyUI server (one per GPU).")
@click.pass_obj
def worker(
    settings: Settings,
    queue: str,
    concurrency: int | None,
    loglevel: str,
    name: str | None,
    device: str | None,
    comfyui_url: str | None,
) -> None:
    """Start a worker. A gpu worker holds its GPU's models and keeps MAS_GPU_LOOKAHEAD tasks ready behind the
    one on the GPU; start one per GPU with --device (and --comfyui-url when each GPU has its ComfyUI)."""
    overrides = {"MAS_GPU_DEVICE": device, "MAS_COMFYUI_URL": comfyui_url}
    if queue != "gpu" and any(overrides.values()):
        raise click.UsageError("--device and --comfyui-url are for a gpu worker (--queue gpu)")
    os.environ.update({key: value for key, value in overrides.items() if value is not None})
    settings = load_settings()  # checked as the worker will read them
    if queue == "gpu":
        vram_plan.check_fits(settings)  # an in-process recipe that cannot fit its budget: one line, now
    ready(settings)
    _exec(processes.worker_argv(settings, queue, concurrency=concurrency, loglevel=loglevel, name=name))


@click.command()
@click.option("--loglevel", default="INFO", show_default=True)
@click.pass_obj
def beat(settings: Settings, loglevel: str) -> None:
    """Start Celery beat with the schedule of beat_schedule.py (its state file in the data folder)."""
    ready(settings)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    _exec(processes.beat_argv(settings, loglevel=loglevel))


@click.command()
@click.option("--address", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", type=PORT, default=5555, show_default=True)
@click.pass_obj
def flower(settings: Settings, address: str, port: int) -> None:
    """Start Flower. Beyond loopback it requires MAS_FLOWER_USER and MAS_FLOWER_PASSWORD."""
    _exec(processes.flower_argv(settings, address=address, port=port))


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", type=PORT, default=8000, show_default=True)
@USER
@click.pass_obj
def serve(settings: Settings, actor: Actor, host: str, port: int) -> None:
    """Open the web gallery: watch videos, compare A/B variations, pick winners.

    Beyond loopback it requires MAS_GALLERY_USER and MAS_GALLERY_PASSWORD. The operator's token (MAS_API_TOKEN),
    and anyone on an open studio, act as `--user` (an admin).
    """
    from mas.gallery import serve as serve_gallery

    ready(settings)
    serve_gallery(settings, host=host, port=port, operator=actor)


COMMANDS = [run, up, down, services_command, worker, beat, flower, serve]
