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
from mas.errors import InvalidInput

DAYS = click.IntRange(1, 3650)
QUOTA = click.IntRange(0, 2**31 - 1)
QUOTA_FLAGS = (
    ("videos_per_day", "videos a day"),
    ("videos_waiting", "videos waiting"),
    ("batches_at_once", "batches at once"),
)
"""Each quota: its field (a `users` column, `--videos-per-day`, `--no-limit-videos-per-day`) and its words."""


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
    """Every user: role, keys in force, whether they have a gallery login; their GPU share, quotas (their own,
    or the studio's default) and whether they have a webhook secret of their own."""
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
    limits = Table("user", "gpu share", "videos/day", "waiting", "at once", "webhook secret")
    for row in rows:
        quotas = (_quota(getattr(row, field), getattr(settings.quotas, field)) for field, _ in QUOTA_FLAGS)
        limits.add_row(row.name, f"{row.gpu_share:g}", *quotas, "own" if row.webhook_secret else "studio's")
    console.print(limits)
    console.print("quotas: videos a day, videos waiting, batches at once; (default): the studio's, MAS_QUOTA_*")


def _quota(own: int | None, default: int | None) -> str:
    """A quota as shown: the user's own, or the studio's default (MAS_QUOTA_*), or none."""
    if own is not None:
        return str(own)
    return "no limit" if default is None else f"{default} (default)"


def _limit_options(command):
    """`--videos-per-day N` / `--no-limit-videos-per-day` and so on, for each quota."""
    for field, words in reversed(QUOTA_FLAGS):
        flag = field.replace("_", "-")
        command = click.option(
            f"--no-limit-{flag}",
            f"unset_{field}",
            is_flag=True,
            help=f"Back to the studio's default {words} (MAS_QUOTA_{field.upper()}; unset there: no limit).",
        )(command)
        command = click.option(f"--{flag}", field, type=QUOTA, default=None, help=f"Their own quota of {words}.")(
            command
        )
    return command


@users_group.command("set")
@click.argument("name")
@click.option(
    "--share", type=float, default=None, help="Their share of the GPU against other users' (above 0; each starts at 1)."
)
@_limit_options
@click.option(
    "--webhook-secret",
    default=None,
    metavar="whsec_...",
    help="Their own webhook signing secret, as MAS_WEBHOOK_SECRET takes one (kept, never shown).",
)
@click.option("--no-webhook-secret", is_flag=True, help="Remove their own webhook secret.")
@click.pass_obj
def users_set(
    settings: Settings,
    name: str,
    share: float | None,
    webhook_secret: str | None,
    no_webhook_secret: bool,
    **quotas: int | bool | None,
) -> None:
    """Set the user's GPU share, quotas (videos a day, videos waiting, batches at once: a submit beyond one is
    refused whole) or webhook secret; what is not given stays as it is."""
    from mas.accounts import users

    changes: dict[str, object] = {} if share is None else {"gpu_share": share}
    for field, _ in QUOTA_FLAGS:
        flag = field.replace("_", "-")
        if quotas[field] is not None and quotas[f"unset_{field}"]:
            raise InvalidInput(f"give --{flag} or --no-limit-{flag}, not both")
        if quotas[field] is not None:
            changes[field] = quotas[field]
        elif quotas[f"unset_{field}"]:
            changes[field] = None
    if webhook_secret is not None and no_webhook_secret:
        raise InvalidInput("give --webhook-secret or --no-webhook-secret, not both")
    if webhook_secret is not None or no_webhook_secret:
        changes["webhook_secret"] = webhook_secret
    ready(settings)
    row = users.set_limits(settings, name, changes)
    shown = ", ".join(
        f"{words} {_quota(getattr(row, field), getattr(settings.quotas, field))}" for field, words in QUOTA_FLAGS
    )
    secret = "their own" if row.webhook_secret else "the studio's"
    console.print(f"{row.name}: gpu share {row.gpu_share:g}; {shown}; webhook secret {secret}")


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
