"""The user's style: teach it in words (`mas style FEEDBACK`), or item by item as given (`--like`, `--avoid`);
see every item and where it came from (`mas style show`); remove one (`mas style forget ITEM`).

Every answer is in sentences: what was understood, item by item, what was not, quoted, and how to say it
plainly."""

from __future__ import annotations

from typing import Any

import click

from mas.cli.context import USER, ready
from mas.cli.output import print_whole
from mas.config import Settings
from mas.domain.identity import DEFAULT_USER, Actor

EXAMPLE = "handheld camera"
"""The item the hints show."""


class StyleGroup(click.Group):
    """`mas style FEEDBACK` beside its commands: a first word that is not a command is the feedback."""

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, Any, list[str]]:
        if args and args[0] not in self.commands:
            return "read", self.commands["read"], args
        return super().resolve_command(ctx, args)


def _say(actor: Actor) -> str:
    """The command as this user types it."""
    return "mas style" if actor.user == DEFAULT_USER else f"mas style --user {actor.user}"


@click.group(cls=StyleGroup, invoke_without_command=True, subcommand_metavar="[FEEDBACK | COMMAND ...]")
@click.option("--like", "likes", multiple=True, metavar="ITEM", help="Store ITEM as liked, exactly as given.")
@click.option("--avoid", "avoids", multiple=True, metavar="ITEM", help="Store ITEM as ruled out, exactly as given.")
@USER
@click.pass_context
def style(ctx: click.Context, actor: Actor, likes: tuple[str, ...], avoids: tuple[str, ...]) -> None:
    """Teach the studio your taste in words, e.g. "I prefer dark moody aesthetics with purple and blue tones",
    or item by item as you give it: --like "film grain", --avoid "handheld camera"."""
    settings: Settings = ctx.obj
    if ctx.invoked_subcommand is not None:
        if likes or avoids:
            raise click.UsageError("give --like / --avoid alone, not with feedback or a command")
        return
    ready(settings)
    if not likes and not avoids:
        _show(settings, actor)
        return
    from mas.learning import style_book

    for words, liked in [*((w, True) for w in likes), *((w, False) for w in avoids)]:
        changed = style_book.give(settings, actor, words, liked=liked)
        for entry in changed.entries:
            was = f" (it was {_polarity(entry.history[-1]['polarity'])})" if changed.turned else ""
            print_whole(f"Stored as you gave it: {entry.sentence()}{was}.")
    print_whole(f"`{_say(actor)} show` lists every item and where it came from.")


@style.command("read", hidden=True)
@click.argument("feedback")
@USER
@click.pass_obj
def read(settings: Settings, actor: Actor, feedback: str) -> None:
    """Read FEEDBACK into liked and ruled-out items."""
    from mas.learning import preferences

    ready(settings)
    lesson = preferences.read_feedback(settings, actor, feedback)
    reader = "the model" if lesson.reader == "model" else "the studio's rules"
    print_whole(f"Read by {reader}." + (f" ({lesson.note})" if lesson.note else ""))
    if lesson.stored:
        print_whole("I understood:")
        for entry in lesson.stored:
            print_whole(f"  {entry.sentence()}")
    else:
        print_whole("I understood nothing I could store as liked or ruled out; nothing changed.")
    for change in lesson.turned:
        print_whole(f"This turns round an earlier item: {change['words']} was {_polarity(change['was'])}.")
    if lesson.not_understood:
        print_whole("I did not understand:")
        for clause in lesson.not_understood:
            print_whole(f'  "{clause}"')
        print_whole(
            f"Nothing of it is stored or applied. Say it plainly, one item at a time: "
            f'{_say(actor)} --like "ITEM" or {_say(actor)} --avoid "ITEM" (e.g. {_say(actor)} --avoid '
            f'"{EXAMPLE}").'
        )
    print_whole(f"`{_say(actor)} show` lists every item and where it came from.")


@style.command("show")
@USER
@click.pass_obj
def show(settings: Settings, actor: Actor) -> None:
    """List your style's items with where each came from, and the feedback not understood."""
    ready(settings)
    _show(settings, actor)


def _show(settings: Settings, actor: Actor) -> None:
    from mas.learning import style_book

    entries = style_book.entries(settings, actor)
    if not entries:
        print_whole(f'{actor.user} has no style items yet: {_say(actor)} "I like dark purple tones".')
    else:
        print_whole(f"{actor.user}'s style, oldest first ({len(entries)} items):")
    for e in entries:
        print_whole(f"  #{e.id} {e.sentence()}: {_origin(e.source, e.feedback)}, {e.at:%Y-%m-%d %H:%M}")
        for before in reversed(e.history):
            said = _origin(before["source"], before["feedback"])
            print_whole(f"      before {before['until'][:16].replace('T', ' ')}: {before['words']}, "
                        f"{_polarity(before['polarity'])}, {said}")  # fmt: skip
    unread = style_book.unread(settings, actor)
    if unread:
        print_whole(f'Not understood (say it plainly: {_say(actor)} --like "ITEM" or --avoid "ITEM"):')
        for u in unread:
            print_whole(f"  {', '.join(repr(c) for c in u.clauses)} in {u.feedback!r}, {u.at:%Y-%m-%d %H:%M}")
    if entries:
        print_whole(f"`{_say(actor)} forget ITEM` removes one (its #id or its words).")


@style.command("forget")
@click.argument("item")
@USER
@click.pass_obj
def forget(settings: Settings, actor: Actor, item: str) -> None:
    """Remove ITEM from your style: its #id (as `mas style show` numbers it) or its words."""
    from mas.learning import style_book

    ready(settings)
    which: int | str = int(item.lstrip("#")) if item.lstrip("#").isdigit() else item
    gone = style_book.forget(settings, actor, which)
    print_whole(f"Removed #{gone.id}: the style no longer {gone.sentence().replace(':', '', 1)}.")


def _polarity(polarity: str) -> str:
    return "liked" if polarity == "liked" else "ruled out"


def _origin(source: str, feedback: str) -> str:
    from mas.learning.style_book import SOURCES

    said = SOURCES.get(source, source)
    quoted = source in ("studio", "model") or (source == "block" and feedback not in ("", "set in the block"))
    return f'{said} "{feedback}"' if quoted and feedback else said


COMMANDS = [style]
