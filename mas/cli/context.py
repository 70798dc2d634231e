"""What every command shares: one console, the settings, and the services brought up before work."""

from __future__ import annotations

import click
from click.core import ParameterSource
from pydantic import ValidationError
from pydantic_settings import SettingsError
from rich.console import Console

from mas import db
from mas.config import Settings
from mas.domain.identity import DEFAULT_USER, Actor
from mas.errors import InvalidInput, InvalidSettings
from mas.runtime import services
from mas.text import visible


class StudioConsole(Console):
    """A console that prints text as text: no markup, no emoji codes, no highlighting, and every control
    character made visible (`mas.text.visible`), in plain prints, tables and live views alike."""

    def __init__(self, **kwargs) -> None:
        super().__init__(markup=False, emoji=False, highlight=False, **kwargs)

    def render_str(self, text: str, **kwargs):
        return super().render_str(visible(text), **kwargs)


console = StudioConsole()

ID = click.IntRange(1, db.MAX_ROW_ID)
"""A batch, video, test or schedule id: what a PostgreSQL integer key can hold."""

LIMIT = click.IntRange(1, 100_000)
"""How many rows a listing shows."""


ACTOR_KEY = "mas.actor"


def _actor(ctx: click.Context, param: click.Parameter, value: str) -> Actor:
    """The user named on the command line, else the one a group above named (`mas style --user NAME show`), else
    MAS_USER or the default user."""
    named = ctx.get_parameter_source(param.name or "") == ParameterSource.COMMANDLINE
    if not named and ACTOR_KEY in ctx.meta:
        return ctx.meta[ACTOR_KEY]
    try:
        actor = Actor(value)
    except InvalidInput as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
    if named:
        ctx.meta[ACTOR_KEY] = actor
    return actor


USER = click.option(
    "--user",
    "actor",
    metavar="NAME",
    envvar="MAS_USER",
    default=DEFAULT_USER,
    callback=_actor,
    help="Whose taste: their style, A/B picks and preference models (default: MAS_USER, else 'default').",
)
"""`--user NAME` (else MAS_USER, else the default user) on the commands that act for a user: the command gets
it as its `actor` (`mas.domain.identity.Actor`), which it hands to every service it calls for that user. The
settings are the same for everyone; MAS_USER is the CLI's own default, read nowhere else."""


def load_settings() -> Settings:
    """The settings from the environment and .env, or the first invalid one named as its MAS_ variable."""
    try:
        return Settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][-1]) if first["loc"] else ""  # a group's value: its variable, MAS_...
        where = field if field.startswith("MAS_") else f"MAS_{field.upper()}" if field else "settings"
        raise InvalidSettings(f"invalid {where}: {visible(first['msg'])}") from None
    except SettingsError as exc:  # a complex setting (a JSON one) that does not parse
        cause = exc.__cause__ or exc
        raise InvalidSettings(f"unreadable setting: {visible(str(exc))}: {visible(str(cause))[:200]}") from None
    except UnicodeDecodeError as exc:
        raise InvalidSettings(
            f"the .env file (or an environment variable) is not UTF-8 text at byte {exc.start}: save it as UTF-8"
        ) from None


def ready(settings: Settings) -> None:
    """Start the embedded services if they are ours, then find the database for this command: reachable, its
    schema up to date (`mas.db.find`)."""
    try:
        services.up(settings)
    except OSError as exc:  # the data folder (or a folder in it) cannot be made
        if exc.filename is None or not str(exc.filename).startswith(str(settings.data_dir.absolute())):
            raise
        raise InvalidSettings(f"MAS_DATA_DIR {settings.data_dir} cannot be used: {exc.strerror or exc}") from None
    db.find(settings)
