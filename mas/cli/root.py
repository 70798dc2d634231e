"""The `mas` group: settings loaded once for every command, and studio errors shown as one line."""

from __future__ import annotations

import click

from mas.cli import control, faults, gpu, letta, memory, quality, studio, style, users, watching, webhooks, work
from mas.cli.context import load_settings
from mas.errors import InvalidInput, StudioError
from mas.redaction import redact_text
from mas.text import check_utf8, visible


def one_line(exc: StudioError) -> str:
    """The error's message on one line, secrets redacted and control characters made visible."""
    lines = [line.strip() for line in redact_text(str(exc)).splitlines() if line.strip()]
    return visible("; ".join(lines) or type(exc).__name__)


class BadUsage(click.ClickException):
    """Input the studio refused: one line, like any studio error, with the exit status of bad usage."""

    exit_code = 2


class StudioGroup(click.Group):
    """A studio error is the user's to act on: its message, one line, no traceback; exit status 2 when the
    input was wrong (bad usage), 1 otherwise. Anything else is a bug and keeps its traceback."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """Refuse an argument that was not UTF-8 before any command sees it: every command then gets text."""
        for arg in args:
            try:
                check_utf8(arg, f"the argument '{visible(arg)[:80]}'")
            except InvalidInput as exc:
                raise BadUsage(one_line(exc)) from None
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except InvalidInput as exc:
            raise BadUsage(one_line(exc)) from exc
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


for group in (studio, work, style, control, faults, watching, quality, memory, letta, webhooks, users, gpu):
    for command in group.COMMANDS:
        main.add_command(command)
