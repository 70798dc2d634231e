"""Quality alignment on the gpu worker, where the models live: grade a video again, run the Tuner now."""

from __future__ import annotations

import click
from rich.table import Table

from mas.cli.context import ID, console, ready
from mas.config import Settings


@click.command()
@click.argument("video", type=ID)
@click.pass_obj
def grade(settings: Settings, video: int) -> None:
    """Grade VIDEO again with DQA and print the per-axis table (changes nothing stored)."""
    from mas import remote

    ready(settings)
    result = remote.regrade(settings, video)
    table = Table("axis", "score", "weight", title=f"video {video}, attempt {result['attempt']}: {result['prompt'][:80]}")
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
@click.pass_obj
def tune(settings: Settings, dry_run: bool) -> None:
    """Run the Tuner now: DPO on your A/B choices; the adapter is promoted only if it predicts better."""
    from mas import remote

    ready(settings)
    report = remote.tune(settings, dry_run=dry_run)
    console.print(report["reason"])
    console.print(
        f"pairs: {report['pairs']} (train {report['train_pairs']}, held out {report['heldout_pairs']}, "
        f"needed {report['needed_pairs']})"
    )
    if report["trained"]:
        console.print(
            f"adapter v{report['version']}: held-out accuracy {report['heldout_accuracy']:.1%} "
            f"({'promoted' if report['promoted'] else 'not promoted'})"
        )


COMMANDS = [grade, tune]
