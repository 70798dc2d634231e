"""The studio's memory: core blocks (show, set, history) and archival passages (search, stats)."""

from __future__ import annotations

import json

import click
from rich.table import Table

from mas.cli.context import LIMIT, USER, console, ready
from mas.cli.output import print_block
from mas.config import Settings
from mas.domain.identity import Actor
from mas.memory import blocks, recall
from mas.memory.archival import ArchivalMemory


@click.group()
def memory() -> None:
    """Inspect and edit the studio's memory: core blocks, archival passages."""


@memory.command("show")
@click.argument("label", required=False)
@USER
@click.pass_obj
def memory_show(settings: Settings, actor: Actor, label: str | None) -> None:
    """Show one core block, or all six."""
    ready(settings)
    shown = {label: blocks.read(settings, actor, label)} if label else blocks.read_all(settings, actor)
    for name, value in shown.items():
        print_block(name, value)


@memory.command("set")
@click.argument("label")
@click.argument("field")
@click.argument("value")
@USER
@click.pass_obj
def memory_set(settings: Settings, actor: Actor, label: str, field: str, value: str) -> None:
    """Set FIELD of block LABEL; VALUE is JSON (3, "text", ["a","b"], null) or plain text."""
    ready(settings)
    print_block(label, blocks.set_field(settings, actor, label, field, value, by="cli"))


@memory.command("history")
@click.argument("label")
@click.option("--limit", type=LIMIT, default=30, show_default=True)
@USER
@click.pass_obj
def memory_history(settings: Settings, actor: Actor, label: str, limit: int) -> None:
    """Show who changed which field of a block, when, from what to what."""
    ready(settings)
    changes = blocks.history(settings, actor, label, limit=limit)
    table = Table("version", "when", "who", "field", "old", "new", title=f"{label} history")
    for c in changes:
        table.add_row(
            str(c.version),
            c.changed_at.strftime("%Y-%m-%d %H:%M:%S"),
            c.actor,
            c.field,
            json.dumps(c.old)[:60],
            json.dumps(c.new)[:60],
        )
    console.print(table)


@memory.command("search")
@click.argument("text")
@click.option("--tag", "tags", multiple=True, help="Only passages with this tag (repeatable).")
@click.option("--limit", type=LIMIT, default=10, show_default=True)
@click.pass_obj
def memory_search(settings: Settings, text: str, tags: tuple[str, ...], limit: int) -> None:
    """Search archival memory by meaning."""
    ready(settings)
    results = ArchivalMemory(settings).search(text, tags=list(tags) or None, limit=limit)
    if not results:
        console.print("no passages match")
        return
    table = Table("id", "similarity", "tags", "when", "text")
    for r in results:
        table.add_row(
            str(r.id), f"{r.similarity:.3f}", ",".join(r.tags), r.created_at.strftime("%Y-%m-%d %H:%M"), r.text[:120]
        )
    console.print(table)


@memory.command("stats")
@click.pass_obj
def memory_stats(settings: Settings) -> None:
    """How much archival memory holds, by tag, and over what time: what the agents know and don't."""
    ready(settings)
    stats = ArchivalMemory(settings).stats()
    console.print(f"archival passages: {stats.total} (oldest {stats.oldest or '-'}, newest {stats.newest or '-'})")
    table = Table("tag", "passages")
    for tag, n in stats.per_tag.items():
        table.add_row(tag, str(n))
    console.print(table)
    buffers = Table("agent", "messages in context")
    for agent in recall.known(settings):
        buffers.add_row(agent, str(recall.count(settings, agent)))
    console.print(buffers)


COMMANDS = [memory]
