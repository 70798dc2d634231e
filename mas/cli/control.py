"""Stopping and holding work: cancel, pause, continue (`mas resume` is the cross-session restart)."""

from __future__ import annotations

import click

from mas.cli.context import ID, console, ready
from mas.config import Settings


@click.command()
@click.argument("batch", type=ID, required=False)
@click.option("--video", type=ID, default=None, help="Cancel only this video; its batch goes on.")
@click.pass_obj
def cancel(settings: Settings, batch: int | None, video: int | None) -> None:
    """Cancel BATCH (every unfinished video, renders stopped where they run), or one video with --video."""
    from mas.pipeline import control

    if (batch is None) == (video is None):
        raise click.UsageError("give a BATCH to cancel, or --video VIDEO (not both)")
    ready(settings)
    if video is not None:
        control.cancel_video(settings, video)
        console.print(f"video {video} cancelled")
        return
    assert batch is not None  # one of the two was given
    cancelled = control.cancel_batch(settings, batch)
    console.print(f"batch {batch} cancelled ({len(cancelled)} unfinished video(s) stopped)")


@click.command()
@click.argument("batch", type=ID)
@click.pass_obj
def pause(settings: Settings, batch: int) -> None:
    """Pause BATCH: no new step starts (running ones finish) until `mas continue BATCH`."""
    from mas.pipeline import control

    ready(settings)
    control.pause_batch(settings, batch)
    console.print(f"batch {batch} paused; `mas continue {batch}` lets it go on")


@click.command(name="continue")
@click.argument("batch", type=ID)
@click.pass_obj
def continue_(settings: Settings, batch: int) -> None:
    """Let a paused BATCH go on from where each video stopped."""
    from mas.pipeline import control

    ready(settings)
    control.continue_batch(settings, batch)
    console.print(f"batch {batch} continues")


COMMANDS = [cancel, pause, continue_]
