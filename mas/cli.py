"""The `mas` command line: run the studio, put work in, watch it.

Errors are one clear line and a non-zero exit; nothing is written when input is refused.
"""

from __future__ import annotations

import os
import shutil
import sys
import time

import click
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from mas import services
from mas.config import Settings, is_loopback

console = Console()


def _fail(message: str) -> None:
    raise click.ClickException(message)


def _load_settings() -> Settings:
    try:
        return Settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        where = f"MAS_{field.upper()}" if field else "settings"
        _fail(f"invalid {where}: {first['msg']}")


def _ready(settings: Settings) -> None:
    """Start the embedded services if they are ours, then check and migrate the database."""
    from mas import db

    try:
        services.up(settings)
        db.ready_engine(settings)
    except (services.ServiceError, db.DatabaseUnavailable) as exc:
        _fail(str(exc))


class StudioGroup(click.Group):
    """Loads settings once for every command and turns known errors into one line."""

    def invoke(self, ctx):
        from mas.agents.letta import LettaError
        from mas.db import DatabaseUnavailable

        try:
            return super().invoke(ctx)
        except (DatabaseUnavailable, services.ServiceError, LettaError) as exc:
            raise click.ClickException(str(exc)) from exc


@click.group(cls=StudioGroup)
@click.pass_context
def main(ctx: click.Context) -> None:
    """mas: an autonomous multi-agent AI video studio.

    Start here:  mas up  ->  mas worker --queue cpu / --queue gpu  ->  mas enqueue "Create 3 videos of dragons"
    """
    ctx.obj = _load_settings()


# --- services -------------------------------------------------------------------------------------


@main.command()
@click.pass_obj
def up(settings: Settings) -> None:
    """Start the embedded PostgreSQL and Redis (if no URLs are set) and apply migrations."""
    _ready(settings)
    _print_services(settings)


@main.command()
@click.pass_obj
def down(settings: Settings) -> None:
    """Stop the embedded PostgreSQL and Redis."""
    stopped = services.down(settings)
    console.print(f"stopped: {', '.join(stopped)}" if stopped else "nothing embedded was running")


@main.command(name="services")
@click.pass_obj
def services_cmd(settings: Settings) -> None:
    """Show which services are used, where, and whether they answer."""
    _print_services(settings)


def _print_services(settings: Settings) -> None:
    table = Table("service", "mode", "running", "url", "pid", "data")
    for info in services.describe(settings):
        table.add_row(
            info.name, info.mode, "yes" if info.running else "no", info.url, str(info.pid or ""), info.data
        )
    console.print(table)


# --- processes ------------------------------------------------------------------------------------


def _exec_celery(args: list[str]) -> None:
    """Replace this process with celery, so signals and exit codes are the worker's own."""
    celery = shutil.which("celery") or sys.executable
    argv = [celery, *args] if celery != sys.executable else [sys.executable, "-m", "celery", *args]
    sys.stdout.flush()
    os.execvp(argv[0], argv)


@main.command()
@click.option(
    "--queue", type=click.Choice(["cpu", "gpu"]), required=True,
    help="Which work to take: cpu (agent steps) or gpu (renders and gradings, queues gpu and gpu-grade).",
)
@click.option("--concurrency", type=int, default=None, help="cpu processes (gpu is always 1).")
@click.option("--loglevel", default="INFO", show_default=True)
@click.option("--name", default=None, help="Worker node name (default QUEUE@hostname).")
@click.pass_obj
def worker(settings: Settings, queue: str, concurrency: int | None, loglevel: str, name: str | None) -> None:
    """Start a worker. A gpu worker runs one task at a time, fetches one at a time, acks late."""
    from mas.celery_app import WORKER_QUEUES

    _ready(settings)
    procs = 1 if queue == "gpu" else (concurrency or settings.cpu_concurrency)
    _exec_celery(
        ["-A", "mas", "worker", "-Q", ",".join(WORKER_QUEUES[queue]), "-c", str(procs), "--prefetch-multiplier", "1",
         "-n", name or f"{queue}@%h", "-l", loglevel, "-E"]
    )


@main.command()
@click.option("--loglevel", default="INFO", show_default=True)
@click.pass_obj
def beat(settings: Settings, loglevel: str) -> None:
    """Start Celery beat with the schedule of beat_schedule.py."""
    _ready(settings)
    schedule_file = settings.data_dir.resolve() / "celerybeat-schedule"
    _exec_celery(["-A", "beat_schedule:app", "beat", "-l", loglevel, "-s", str(schedule_file)])


@main.command()
@click.option("--address", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", default=5555, show_default=True)
@click.pass_obj
def flower(settings: Settings, address: str, port: int) -> None:
    """Start Flower. Beyond loopback it requires MAS_FLOWER_USER and MAS_FLOWER_PASSWORD."""
    auth = None
    if settings.flower_user and settings.flower_password:
        auth = f"{settings.flower_user}:{settings.flower_password.get_secret_value()}"
    if auth is None and not is_loopback(address):
        _fail(f"refusing to serve Flower on {address} without auth: set MAS_FLOWER_USER and MAS_FLOWER_PASSWORD")
    args = ["-A", "mas", "flower", f"--address={address}", f"--port={port}"]
    if auth:
        args.append(f"--basic-auth={auth}")
    _exec_celery(args)


# --- work -----------------------------------------------------------------------------------------


@main.command()
@click.argument("request")
@click.option("--wait", is_flag=True, help="Follow the batch until every video is done.")
@click.option("--at", "at", default=None, metavar="HH:MM", help="Start at this local time (next occurrence).")
@click.pass_obj
def enqueue(settings: Settings, request: str, wait: bool, at: str | None) -> None:
    """Queue a production request, e.g. "Create 10 videos of mythical creatures"."""
    from mas.production import schedule
    from mas.requests import RequestError, parse_request

    if at is not None:
        run_at = _next_time(at)
        try:
            parsed = parse_request(request, settings)
        except RequestError as exc:
            _fail(str(exc))
        _ready(settings)
        schedule_id = schedule(settings, parsed, run_at=run_at)
        console.print(f"schedule {schedule_id}: {request!r} starts at {run_at.astimezone():%Y-%m-%d %H:%M %Z} (needs `mas beat`)")
        return
    _submit(settings, request, wait)


def _next_time(text: str):
    """The next local occurrence of HH:MM, as an aware datetime."""
    from datetime import datetime, timedelta

    try:
        hour, minute = (int(part) for part in text.split(":"))
        now = datetime.now().astimezone()
        run_at = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
    except ValueError:
        _fail(f"--at wants a time as HH:MM (24 h), got {text!r}")
    return run_at if run_at > now else run_at + timedelta(days=1)


@main.group(name="schedule")
def schedule_group() -> None:
    """Overnight batches: list them, cancel one."""


@schedule_group.command("list")
@click.pass_obj
def schedule_list(settings: Settings) -> None:
    """Show scheduled, sent and cancelled batches."""
    from mas.production import schedules

    _ready(settings)
    rows = schedules(settings)
    if not rows:
        console.print("nothing scheduled: use `mas enqueue --at HH:MM \"...\"`")
        return
    table = Table("id", "runs at", "status", "batch", "request")
    for row in rows:
        table.add_row(str(row.id), f"{row.run_at.astimezone():%Y-%m-%d %H:%M}", row.status, str(row.batch_id or ""), row.request)
    console.print(table)


@schedule_group.command("cancel")
@click.argument("schedule_id", type=int)
@click.pass_obj
def schedule_cancel(settings: Settings, schedule_id: int) -> None:
    """Cancel a scheduled batch that has not started."""
    from mas.production import cancel_schedule

    _ready(settings)
    if not cancel_schedule(settings, schedule_id):
        _fail(f"no pending schedule {schedule_id} (already run, cancelled or unknown); nothing changed")
    console.print(f"schedule {schedule_id} cancelled")


@main.command()
@click.pass_obj
def recover(settings: Settings) -> None:
    """Rebuild the queues from Postgres after the broker lost its data (safe to run any time).

    Runs on a cpu worker, which sees what every worker holds; start one first if none runs.
    """
    from celery.exceptions import TimeoutError as ResultTimeout

    from mas.celery_app import app

    _ready(settings)
    try:
        report = app.send_task("tasks.maintenance.recover").get(timeout=120)
    except ResultTimeout:
        _fail("no cpu worker answered within 120 s: start one with `mas worker --queue cpu`, then run this again")
    console.print(
        f"re-planned {len(report['replanned'])} batch(es), re-sent {len(report['resent'])} video(s); "
        "anything still queued or running was left alone"
    )


@main.command()
@click.argument("batch", type=int, required=False)
@click.option("--follow", is_flag=True, help="Keep showing progress until the batch is done.")
@click.pass_obj
def status(settings: Settings, batch: int | None, follow: bool) -> None:
    """Show a batch's progress (default: the latest batch)."""
    _ready(settings)
    if follow:
        _follow(settings, batch)
    else:
        _show_batch(settings, batch)
    _show_gpu(settings)


def _show_gpu(settings: Settings) -> None:
    """GPU work waiting, and model residency as the gpu worker last published it (loads, evictions, swaps)."""
    import json

    from mas.celery_app import GPU_QUEUE, GPU_STATS_KEY, GRADE_QUEUE, app, queue_keys

    client = services.redis_client(settings)
    renders, gradings = (sum(client.llen(k) for k in queue_keys(app, q)) for q in (GPU_QUEUE, GRADE_QUEUE))
    console.print(f"gpu queue: {renders} renders and {gradings} gradings waiting")
    raw = client.get(GPU_STATS_KEY)
    if raw is None:
        return
    s = json.loads(raw)
    console.print(
        f"gpu models: {s['loads']} loads, {s['evictions']} evictions, {s['swaps']} swaps, "
        f"resident: {', '.join(s['resident']) or 'none'}"
    )


def _show_batch(settings: Settings, batch_id: int | None):
    from mas.production import batch_overview

    batch = batch_overview(settings, batch_id)
    if batch is None:
        _fail(f"no batch {batch_id}" if batch_id else "no batches yet: queue one with `mas enqueue`")
    console.print(_batch_table(batch))
    return batch


def _batch_table(batch):
    from rich.console import Group
    from rich.progress_bar import ProgressBar

    done = sum(v.state.value in ("accepted", "failed") for v in batch.videos)
    table = Table("video", "state", "attempts", "grade", "concept", "file")
    for v in batch.videos:
        table.add_row(str(v.id), v.state.value, str(v.attempt_count), v.grade or "", v.concept, v.output_path or "")
    header = f"batch {batch.id} [{batch.status.value}] {done}/{batch.total} done: {batch.request}"
    return Group(header, ProgressBar(total=max(batch.total, 1), completed=done, width=60), table)


def _follow(settings: Settings, batch_id: int | None, *, poll: float = 1.0) -> None:
    from rich.live import Live

    from mas.production import batch_overview

    batch = batch_overview(settings, batch_id)
    if batch is None:
        _fail(f"no batch {batch_id}" if batch_id else "no batches yet")
    with Live(_batch_table(batch), console=console, refresh_per_second=4) as live:
        while batch.status.value not in ("done", "cancelled"):
            time.sleep(poll)
            batch = batch_overview(settings, batch.id)
            live.update(_batch_table(batch))


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", default=8000, show_default=True)
@click.pass_obj
def serve(settings: Settings, host: str, port: int) -> None:
    """Open the web gallery: watch videos, compare A/B variations, pick winners.

    Beyond loopback it requires MAS_GALLERY_USER and MAS_GALLERY_PASSWORD.
    """
    from mas.gallery import GalleryError, serve as run_gallery

    _ready(settings)
    try:
        run_gallery(settings, host=host, port=port)
    except GalleryError as exc:
        _fail(str(exc))


@main.command()
@click.option("--batch", type=int, default=None, help="Only this batch's videos.")
@click.option("--limit", type=int, default=50, show_default=True)
@click.pass_obj
def videos(settings: Settings, batch: int | None, limit: int) -> None:
    """List finished and running videos with their grades and files."""
    import sqlalchemy as sa

    from mas.db import session_scope
    from mas.models import Video

    _ready(settings)
    with session_scope(settings) as session:
        stmt = sa.select(Video).order_by(Video.id.desc()).limit(limit)
        if batch is not None:
            stmt = stmt.where(Video.batch_id == batch)
        rows = session.scalars(stmt).all()
    if not rows:
        console.print("no videos yet" if batch is None else f"batch {batch} has no videos")
        return
    table = Table("video", "batch", "state", "grade", "attempts", "file")
    for v in reversed(rows):
        table.add_row(str(v.id), str(v.batch_id), v.state.value, v.grade or "", str(v.attempt_count), v.output_path or "")
    console.print(table)
    console.print(f"videos are written under {settings.videos_dir}")


@main.command()
@click.argument("feedback")
@click.pass_obj
def style(settings: Settings, feedback: str) -> None:
    """Teach the studio your taste, e.g. "I prefer dark moody aesthetics with purple and blue tones"."""
    from mas.preferences import PreferenceError, learn_style

    _ready(settings)
    try:
        value = learn_style(settings, feedback)
    except PreferenceError as exc:
        _fail(str(exc))
    _print_block("user_style", value)


@main.command()
@click.argument("name")
@click.option("--episodes", type=int, default=3, show_default=True, help="Episodes to make now.")
@click.option("--wait", is_flag=True, help="Follow the batch until it is done.")
@click.pass_obj
def series(settings: Settings, name: str, episodes: int, wait: bool) -> None:
    """Make (or continue) a series: episodes keep its style and consistency rules across sessions."""
    _submit(settings, f"Create a {episodes}-part {name} series", wait)


@main.command()
@click.argument("concept")
@click.option("--variations", type=int, default=3, show_default=True)
@click.option("--wait", is_flag=True, help="Follow the batch until it is done.")
@click.pass_obj
def ab(settings: Settings, concept: str, variations: int, wait: bool) -> None:
    """Render variations of one concept; then choose the winner with `mas pick TEST LABEL`."""
    _submit(settings, f'Generate {variations} variations of "{concept}"', wait)


def _submit(settings: Settings, request: str, wait: bool) -> None:
    from mas.production import submit
    from mas.requests import RequestError, parse_request

    try:
        parsed = parse_request(request, settings)
    except RequestError as exc:
        _fail(str(exc))
    _ready(settings)
    batch_id = submit(settings, parsed)
    console.print(f"batch {batch_id}: {parsed.count} x {parsed.kind} of {parsed.theme!r} queued")
    if wait:
        _follow(settings, batch_id)


@main.command()
@click.argument("test", type=int)
@click.argument("label")
@click.pass_obj
def pick(settings: Settings, test: int, label: str) -> None:
    """Choose the winning variation of A/B test TEST (label A, B, ...)."""
    from mas.preferences import PreferenceError
    from mas.preferences import pick as record_pick

    _ready(settings)
    try:
        value = record_pick(settings, test, label)
    except PreferenceError as exc:
        _fail(str(exc))
    console.print(f"test {test}: {label.upper()} recorded as the winner")
    _print_block("ab_testing", value)


@main.command()
@click.option("--yes", is_flag=True, help="Resume without asking.")
@click.pass_obj
def resume(settings: Settings, yes: bool) -> None:
    """Offer and restart the work a previous session left pending."""
    from mas.celery_app import app
    from mas.memory import blocks

    _ready(settings)
    pending = blocks.read(settings, "session_state")["PENDING_WORK"]
    if not pending:
        console.print("nothing to resume: no pending work")
        return
    for work in pending:
        console.print(f"pending: batch {work['batch_id']}: {work['request']}")
    if not yes and not click.confirm("resume these now?", default=True):
        console.print("left pending")
        return
    for work in pending:
        app.send_task("tasks.pipeline.resume_batch", args=[work["batch_id"]])
    console.print(f"resumed {len(pending)} batch(es); follow with `mas status --follow`")


# --- quality alignment ----------------------------------------------------------------------------


def _on_gpu(settings: Settings, task: str, *args, timeout: float = 1800):
    """Run a gpu-queue task (where the models live) and wait for its answer."""
    from celery.exceptions import TimeoutError as ResultTimeout

    from mas.celery_app import app

    _ready(settings)
    try:
        return app.send_task(task, args=list(args)).get(timeout=timeout)
    except ResultTimeout:
        _fail(f"no gpu worker answered within {int(timeout)} s: start one with `mas worker --queue gpu`")
    except Exception as exc:  # the task's own error, raised here by Celery: one line, not a traceback
        _fail(f"{type(exc).__name__}: {exc}")


@main.command()
@click.argument("video", type=int)
@click.pass_obj
def grade(settings: Settings, video: int) -> None:
    """Grade VIDEO again with DQA and print the per-axis table (changes nothing stored)."""
    result = _on_gpu(settings, "gpu.tasks.regrade", video, timeout=600)
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


@main.command()
@click.option("--dry-run", is_flag=True, help="Say what would be trained, train nothing.")
@click.pass_obj
def tune(settings: Settings, dry_run: bool) -> None:
    """Run the Tuner now: DPO on your A/B choices; the adapter is promoted only if it predicts better."""
    report = _on_gpu(settings, "gpu.tasks.tune", dry_run)
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


# --- letta ----------------------------------------------------------------------------------------


@main.group(name="letta")
def letta_group() -> None:
    """The Letta agent backend (MAS_AGENT_BACKEND=letta): its agents and shared blocks on the server."""


@letta_group.command("provision")
@click.pass_obj
def letta_provision(settings: Settings) -> None:
    """Create the agents and the six shared blocks on the Letta server, or repair them; safe to repeat."""
    from mas.agents import letta

    _ready(settings)
    try:
        result = letta.provision(settings)
    except letta.LettaError as exc:
        _fail(str(exc))
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
@click.pass_obj
def letta_status(settings: Settings) -> None:
    """Server health, block ids, and per agent: in-context messages, sleeptime frequency and companions."""
    from mas.agents import letta

    state = letta.status(settings)
    if not state.healthy:
        _fail(f"Letta at {state.url} is not reachable or not healthy: {state.error}")
    console.print(f"Letta {state.version} at {state.url}: {'provisioned' if state.provisioned else 'NOT fully provisioned'}")
    blocks_table = Table("block", "id")
    for label, block_id in state.blocks.items():
        blocks_table.add_row(label, block_id or "[red]missing[/red]")
    console.print(blocks_table)
    agents_table = Table("agent", "id", "in context", "sleeptime every", "sleeptime agents (in context, autoclear)", "problems")
    for a in state.agents:
        companions = "; ".join(f"{c.name} ({c.in_context}, {'on' if c.autoclear else 'OFF'})" for c in a.companions)
        agents_table.add_row(
            a.role, a.id or "-", str(a.in_context if a.in_context is not None else "-"),
            str(a.sleeptime_frequency or "-"), companions or "-", "; ".join(a.problems) or "-",
        )
    console.print(agents_table)


# --- memory ---------------------------------------------------------------------------------------


@main.group()
def memory() -> None:
    """Inspect and edit the studio's memory: core blocks, archival passages."""


def _print_block(label: str, value: dict) -> None:
    import json

    table = Table("field", "value", title=label)
    for field, v in value.items():
        table.add_row(field, v if isinstance(v, str) else json.dumps(v))
    console.print(table)


@memory.command("show")
@click.argument("label", required=False)
@click.pass_obj
def memory_show(settings: Settings, label: str | None) -> None:
    """Show one core block, or all six."""
    from mas.memory import blocks

    _ready(settings)
    try:
        shown = {label: blocks.read(settings, label)} if label else blocks.read_all(settings)
    except blocks.BlockError as exc:
        _fail(str(exc))
    for name, value in shown.items():
        _print_block(name, value)


@memory.command("set")
@click.argument("label")
@click.argument("field")
@click.argument("value")
@click.pass_obj
def memory_set(settings: Settings, label: str, field: str, value: str) -> None:
    """Set FIELD of block LABEL; VALUE is JSON (3, "text", ["a","b"], null) or plain text."""
    from mas.memory import blocks

    _ready(settings)
    try:
        new = blocks.set_field(settings, label, field, value, actor="cli")
    except blocks.BlockError as exc:
        _fail(str(exc))
    _print_block(label, new)


@memory.command("history")
@click.argument("label")
@click.option("--limit", type=int, default=30, show_default=True)
@click.pass_obj
def memory_history(settings: Settings, label: str, limit: int) -> None:
    """Show who changed which field of a block, when, from what to what."""
    import json

    from mas.memory import blocks

    _ready(settings)
    try:
        changes = blocks.history(settings, label, limit=limit)
    except blocks.BlockError as exc:
        _fail(str(exc))
    table = Table("version", "when", "who", "field", "old", "new", title=f"{label} history")
    for c in changes:
        table.add_row(str(c.version), c.changed_at.strftime("%Y-%m-%d %H:%M:%S"), c.actor, c.field,
                      json.dumps(c.old)[:60], json.dumps(c.new)[:60])
    console.print(table)


@memory.command("search")
@click.argument("text")
@click.option("--tag", "tags", multiple=True, help="Only passages with this tag (repeatable).")
@click.option("--limit", type=int, default=10, show_default=True)
@click.pass_obj
def memory_search(settings: Settings, text: str, tags: tuple[str, ...], limit: int) -> None:
    """Search archival memory by meaning."""
    from mas.memory.archival import ArchivalMemory

    _ready(settings)
    try:
        results = ArchivalMemory(settings).search(text, tags=list(tags) or None, limit=limit)
    except ValueError as exc:
        _fail(str(exc))
    if not results:
        console.print("no passages match")
        return
    table = Table("id", "similarity", "tags", "when", "text")
    for r in results:
        table.add_row(str(r.id), f"{r.similarity:.3f}", ",".join(r.tags), r.created_at.strftime("%Y-%m-%d %H:%M"), r.text[:120])
    console.print(table)


@memory.command("stats")
@click.pass_obj
def memory_stats(settings: Settings) -> None:
    """How much archival memory holds, by tag, and over what time: what the agents know and don't."""
    from mas.memory import recall
    from mas.memory.archival import ArchivalMemory

    _ready(settings)
    stats = ArchivalMemory(settings).stats()
    console.print(f"archival passages: {stats.total} (oldest {stats.oldest or '-'}, newest {stats.newest or '-'})")
    table = Table("tag", "passages")
    for tag, n in stats.per_tag.items():
        table.add_row(tag, str(n))
    console.print(table)
    buffers = Table("agent", "messages in context")
    for agent in recall.AGENTS:
        buffers.add_row(agent, str(recall.count(settings, agent)))
    console.print(buffers)


if __name__ == "__main__":
    main()
