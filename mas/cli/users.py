"""`mas users`: who may use the studio through the API and the gallery, with which role and which keys.

The CLI itself runs on the studio's host as its operator; these commands make the credentials other people
and programs use. A key is printed once, when it is made: only its hash is kept.
"""

from __future__ import annotations

from datetime import timedelta

import click
from rich.table import Table

from mas.cli.context import console, ready
from mas.config import Settings

DAYS = click.IntRange(1, 3650)


def _lifetime(days: int | None) -> timedelta | None:
    return None if days is None else timedelta(days=days)


def _show_key(key: str) -> None:
    click.echo(key)  # whole, on a line of its own, for a script to read
    click.echo("(shown once: keep it now; send it as `Authorization: Bearer <key>`)", err=True)


@click.group(name="users")
def users_group() -> None:
    """Users of the API and the gallery: admins see and act on everyone's work, members on their own."""


@users_group.command("add")
@click.argument("name")
@click.option("--admin", is_flag=True, help="An admin: everyone's work and the studio's settings.")
@click.option("--expires-days", type=DAYS, default=None, help="The first key stops working after this many days.")
@click.pass_obj
def users_add(settings: Settings, name: str, admin: bool, expires_days: int | None) -> None:
    """Make a user (a member unless --admin) and print their first API key, once."""
    from mas.accounts import users

    ready(settings)
    _show_key(users.add(settings, name, role="admin" if admin else "member", expires_in=_lifetime(expires_days)))


@users_group.command("list")
@click.pass_obj
def users_list(settings: Settings) -> None:
    """Every user: role, keys in force, whether they have a gallery login."""
    from mas.accounts import users

    ready(settings)
    rows = users.listed(settings)
    if not rows:
        console.print("no users: the studio is used by its operator only (MAS_API_TOKEN, MAS_GALLERY_USER)")
        return
    table = Table("user", "role", "keys in force", "gallery login", "since")
    for row in rows:
        table.add_row(row.name, row.role, str(row.keys), "yes" if row.login else "no", f"{row.created_at:%Y-%m-%d}")
    console.print(table)


@users_group.command("keys")
@click.argument("name")
@click.option("--expires-days", type=DAYS, default=None, help="The key stops working after this many days.")
@click.pass_obj
def users_keys(settings: Settings, name: str, expires_days: int | None) -> None:
    """Print a new API key for the user, once (their other keys stay valid until revoked)."""
    from mas.accounts import users

    ready(settings)
    _show_key(users.new_key(settings, name, expires_in=_lifetime(expires_days)))


@users_group.command("password")
@click.argument("name")
@click.password_option(prompt="Gallery password", help="Read from the terminal when not given.")
@click.pass_obj
def users_password(settings: Settings, name: str, password: str) -> None:
    """Set the user's gallery login (their name and this password; kept as a scrypt hash)."""
    from mas.accounts import users

    ready(settings)
    users.set_password(settings, name, password)
    console.print(f"{name} can log in to the gallery")


@users_group.command("revoke")
@click.argument("name")
@click.argument("key_id", required=False)
@click.pass_obj
def users_revoke(settings: Settings, name: str, key_id: str | None) -> None:
    """Revoke every key of the user and their gallery login, or only the key KEY_ID (the part after `mas_`)."""
    from mas.accounts import users

    ready(settings)
    count = users.revoke(settings, name, key_id)
    console.print(f"revoked {count} key{'s' if count != 1 else ''} of {name}" + ("" if key_id else " and their login"))


COMMANDS = [users_group]
