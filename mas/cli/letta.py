"""The Letta agent backend (MAS_AGENT_BACKEND=letta): provision its agents and blocks, show their state."""

from __future__ import annotations

import click
from rich.table import Table

from mas.agents import letta as backend
from mas.cli.context import USER, console, ready
from mas.config import Settings
from mas.domain.identity import Actor


@click.group(name="letta")
def letta_group() -> None:
    """The Letta agent backend (MAS_AGENT_BACKEND=letta): each user's agents and blocks on the server."""


@letta_group.command("provision")
@USER
@click.pass_obj
def letta_provision(settings: Settings, actor: Actor) -> None:
    """Create the user's agents and their six blocks on the Letta server, or repair them; safe to repeat.
    A user's crew is also made on their first role call."""
    ready(settings)
    result = backend.provision(settings, actor)
    for line in result.created:
        console.print(f"created {line}")
    for line in result.changed:
        console.print(f"repaired {line}")
    if not result.created and not result.changed:
        console.print("already provisioned: nothing created, nothing changed")
    table = Table("agent", "id", "sleeptime agents")
    for role, ids in result.agents.items():
        table.add_row(role, ids.id, ", ".join(ids.sleeptime_ids))
    console.print(table)


@letta_group.command("status")
@USER
@click.pass_obj
def letta_status(settings: Settings, actor: Actor) -> None:
    """Server health, the user's block ids, and per agent of their crew: in-context messages, sleeptime
    frequency and companions."""
    state = backend.status(settings, actor)
    if not state.healthy:
        raise click.ClickException(f"Letta at {state.url} is not reachable or not healthy: {state.error}")
    console.print(
        f"Letta {state.version} at {state.url}: {'provisioned' if state.provisioned else 'NOT fully provisioned'}"
    )
    blocks_table = Table("block", "id")
    for label, block_id in state.blocks.items():
        blocks_table.add_row(label, block_id or "missing")
    console.print(blocks_table)
    agents_table = Table(
        "agent", "id", "in context", "sleeptime every", "sleeptime agents (in context, autoclear)", "problems"
    )
    for a in state.agents:
        companions = "; ".join(f"{c.name} ({c.in_context}, {'on' if c.autoclear else 'OFF'})" for c in a.companions)
        agents_table.add_row(
            a.role,
            a.id or "-",
            str(a.in_context if a.in_context is not None else "-"),
            str(a.sleeptime_frequency or "-"),
            companions or "-",
            "; ".join(a.problems) or "-",
        )
    console.print(agents_table)


COMMANDS = [letta_group]
