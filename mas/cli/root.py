"""The `mas` group: settings loaded once for every command, and studio errors shown as one line."""

from __future__ import annotations

import click

from mas.cli import control, letta, memory, quality, studio, watching, work
from mas.cli.context import load_settings
from mas.errors import StudioError


def one_line(exc: StudioError) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return "; ".join(lines) or type(exc).__name__


class StudioGroup(click.Group):
    """A studio error is the user's to act on: its message, one line, exit status 1, no traceback.
    Anything else is a bug and keeps its traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except StudioError as exc:
            raise click.ClickException(one_line(exc)) from exc


@click.group(cls=StudioGroup)
@click.pass_context
def main(ctx: click.Context) -> None:
    """mas: an autonomous multi-agent AI video studio.

    \b
    Start here:
      mas run                                          the whole studio, in this terminal
      mas enqueue --wait "Create 3 videos of dragons"  in another terminal
    """
    ctx.obj = load_settings()


for group in (studio, work, control, watching, quality, memory, letta):
    for command in group.COMMANDS:
        main.add_command(command)
