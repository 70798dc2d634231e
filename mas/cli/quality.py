"""Quality alignment on the gpu worker, where the models live: grade a video again, run the Tuner now."""

from __future__ import annotations

import click
from rich.table import Table

from mas.cli.context import ID, USER, console, ready
from mas.config import Settings
from mas.domain.identity import Actor


@click.command()
@click.argument("video", type=ID)
@click.pass_obj
def grade(settings: Settings, video: int) -> None:
    """Grade VIDEO again with DQA and print the per-axis table (changes nothing stored)."""
    from mas.runtime import remote

    ready(settings)
    result = remote.regrade(settings, video)
    table = Table(
        "axis", "score", "weight", title=f"video {video}, attempt {result['attempt']}: {result['prompt'][:80]}"
    )
    for row in result["rows"]:
        name = f"  {row['name']}" if row.get("parent") else row["name"]
        score = "—" if row["score"] is None else f"{row['score']:.3f}"
        weight = f"{row['weight']:.0%}" if row.get("weight") else ""
        table.add_row(name, score, weight)
    console.print(table)
    console.print(
        f"grade {result['grade']} (total {result['total']:.3f}); stored: {result['stored_grade'] or '-'} "
        f"by {result['stored_grader'] or '-'}"
    )
    if result["failure_reasons"]:
        console.print("weakest: " + "; ".join(result["failure_reasons"]))


@click.command()
@click.option("--dry-run", is_flag=True, help="Say what would be trained, train nothing.")
@USER
@click.pass_obj
def tune(settings: Settings, actor: Actor, dry_run: bool) -> None:
    """Run the Tuner now for one user (`--user`): their pairwise taste, and a DPO adapter when a base model
    is configured; each is promoted only if picks it never saw do not say it is worse, and it says why."""
    from mas.runtime import remote

    ready(settings)
    report = remote.tune(settings, actor, dry_run=dry_run)
    console.print(
        f"{report['user']}: {report['pairs']} preference pairs ({report['needed_pairs']} needed); DPO trains on "
        f"{report['train_pairs']} and holds out {report['heldout_pairs']}"
    )
    if report["taste"]:
        console.print(report["taste"]["reason"])
    console.print(report["reason"])


COMMANDS = [grade, tune]
