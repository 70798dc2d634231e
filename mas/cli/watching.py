"""Watching work: a batch's progress (once, or live until it is done), the videos, waiting gpu work."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import click
from rich.console import Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from mas.cli.context import ID, LIMIT, StudioConsole, console, ready
from mas.cli.output import print_files, print_whole
from mas.config import Settings
from mas.errors import PermanentError
from mas.learning import style_book
from mas.models import BatchStatus
from mas.runtime import failover
from mas.runtime.failover import DatabaseUnavailable
from mas.storage import storage
from mas.text import visible

FINISHED = (BatchStatus.done, BatchStatus.failed, BatchStatus.cancelled)
T = TypeVar("T")
err_console = StudioConsole(stderr=True)
"""Where a watcher says what it waits for (stdout stays the batch's view)."""


@click.command()
@click.argument("batch", type=ID, required=False)
@click.option("--follow", is_flag=True, help="Keep showing progress until the batch is done.")
@click.pass_obj
def status(settings: Settings, batch: int | None, follow: bool) -> None:
    """Show a batch's progress (default: the latest batch) and the gpu work waiting."""
    from mas.reports import queries

    ready(settings)
    if follow:
        follow_batch(settings, batch)
    else:
        shown = _batch(settings, batch)
        places = queries.batch_places(settings, shown.id)
        console.print(_batch_view(shown, queries.waiting_on_recovery(settings), places))
        for video_id, place in places.items():  # an estimate: the order of today, one render at a time
            console.print(f"video {video_id} waits: {place.text()}")
        print_files(settings, shown.videos)
        usage = queries.agent_usage(settings, shown.id)
        if warning := queries.model_unusable(settings, usage):
            print_whole(f"warning: {warning}")
        if usage.calls:
            cached = 100 * usage.cached_tokens / max(usage.prompt_tokens, 1)
            console.print(
                f"agents: {usage.calls} calls ({usage.invalid} without a valid reply), {usage.seconds:.0f} s; per "
                f"video {usage.per_video(usage.prompt_tokens):.0f} prompt tokens ({cached:.0f} % from the "
                f"endpoint's cache), {usage.per_video(usage.completion_tokens):.0f} completion tokens"
            )
    gpu = queries.gpu_summary(settings)
    console.print(
        f"gpu queue: {gpu.urgent_waiting} high-priority tasks, {gpu.renders_waiting} renders and "
        f"{gpu.gradings_waiting} gradings waiting"
    )
    for w in gpu.workers:
        models = (
            f"{w.loads} loads, {w.evictions} evictions, {w.swaps} swaps, resident: {', '.join(w.resident) or 'none'}"
            if w.loads is not None
            else "no models of its own"
        )
        console.print(
            f"gpu worker {w.name} ({w.device}): {w.turns} turns, {w.busy_seconds:.0f} s on the GPU; {models}",
            markup=False,
        )
    faults = queries.row_faults(settings)  # rows a periodic job could not process: none, mostly
    for job, key, fault in faults:
        print_whole(f"{job} {key}: {fault.text()}")
    if faults:
        print_whole("(`mas faults list` shows every one; `mas faults retry JOB ROW` once a row is mended)")


def follow_batch(settings: Settings, batch_id: int | None, *, poll_s: float = 1.0) -> None:
    """Show the batch live until it is done or cancelled, then its files. A database that is away (a restart,
    a failover) is waited out for MAS_DATABASE_WAIT_SECONDS, saying so on stderr: the batch goes on meanwhile."""
    from mas.reports import queries

    answered = _Answered(settings)
    batch = answered(lambda: _batch(settings, batch_id))
    told: dict[int, str] = {}
    with Live(_batch_view(batch), console=console, refresh_per_second=4) as live:
        while batch.status not in FINISHED:
            time.sleep(poll_s)
            batch, recovering, places = answered(partial(_look, settings, batch.id))
            live.update(_batch_view(batch, recovering, places))
            for video in batch.videos:  # said once each, as lines: a log or a pipe shows no live table
                if recovering.get(video.id, told.get(video.id)) != told.get(video.id):
                    live.console.print(f"video {video.id}: {recovering[video.id]}", markup=False)
                    told[video.id] = recovering[video.id]
    if not console.is_terminal:  # Live ends its last line only on a terminal
        console.line()
    print_files(settings, batch.videos)
    if warning := queries.model_unusable(settings, queries.agent_usage(settings, batch.id)):
        print_whole(f"warning: {warning}")
    outcomes = queries.Outcomes.of(batch.videos)
    counts = outcomes.text(batch.total)
    if batch.status == BatchStatus.failed:
        raise BatchEnded(f"batch {batch.id} failed: {batch.failure_reason or 'no reason recorded'}; {counts}")
    if batch.status == BatchStatus.cancelled:
        raise BatchEnded(f"batch {batch.id} was cancelled; {counts}")
    if outcomes.failed:
        raise BatchEnded(f"batch {batch.id} done: {counts}")
    console.print(f"batch {batch.id} done: {counts}", markup=False)


def _look(settings: Settings, batch_id: int) -> tuple[Any, dict[int, str], dict]:
    """The batch, its videos waiting on recovery and its places ahead of the GPUs: one look of a watcher."""
    from mas.reports import queries

    return _batch(settings, batch_id), queries.waiting_on_recovery(settings), queries.batch_places(settings, batch_id)


class _Answered:
    """Calls that read the database, each waited out through a failover (`failover.waited_out`); the wait is
    said once on stderr, with its bound, and its end too."""

    def __init__(self, settings: Settings) -> None:
        self.seconds = settings.reliability.database_wait_seconds
        self.waiting = False

    def __call__(self, read: Callable[[], T]) -> T:
        try:
            answer = failover.waited_out(read, seconds=self.seconds, waiting=self._say)
        except failover.DATABASE_AWAY as exc:
            raise DatabaseUnavailable(
                f"the database did not answer for {self.seconds:.0f} s (MAS_DATABASE_WAIT_SECONDS); the batch goes "
                f"on without this watcher: {exc}"
            ) from exc
        if self.waiting:
            self.waiting = False
            err_console.print("database answers again")
        return answer

    def _say(self, exc: BaseException, left: float) -> None:
        if not self.waiting:
            self.waiting = True
            err_console.print(f"{failover.FAILING_OVER}: waiting up to {left:.0f} s ({type(exc).__name__})")


class BatchEnded(PermanentError):
    """A followed batch ended with work not accepted (a video failed, or the batch failed or was cancelled):
    `--wait` exits non-zero, its last line the counts."""


def _batch(settings: Settings, batch_id: int | None):
    from mas.reports import queries

    batch = queries.batch_overview(settings, batch_id)
    if batch is None:
        raise click.ClickException(
            f"no batch {batch_id}" if batch_id else "no batches yet: queue one with `mas enqueue`"
        )
    return batch


def _batch_view(batch, recovering: dict[int, str] | None = None, places: dict | None = None) -> Group:
    """Header, progress bar and the videos (their files are printed whole after the table); a video whose
    step's worker stopped answering says so (`recovering`), one on its way to the GPU how many renders are
    ahead of it and when its own may start (`places`: `queries.places`)."""
    from mas.reports import queries

    recovering, places = recovering or {}, places or {}
    outcomes = queries.Outcomes.of(batch.videos)
    header = Text(
        visible(
            f"batch {batch.id} [{batch.status.value}] {outcomes.done}/{batch.total} done "
            f"({outcomes.text(batch.total)}): {batch.request}"
        )
    )
    if batch.failure_reason:
        header.append(visible(f"\nfailed: {batch.failure_reason}"))
    if batch.style is not None:
        header.append(visible(f"\nstyle applied: {style_book.applied_text(batch.style)}"))
    bar = Table.grid()  # a grid ends its line: a bare progress bar would run on into the table below
    bar.add_row(ProgressBar(total=max(batch.total, 1), completed=outcomes.done, width=60))
    table = Table("video", "state", "attempts", "grade", "prompt by", "concept")
    for v in batch.videos:
        state = f"{v.state.value} ({recovering[v.id]})" if v.id in recovering else v.state.value
        if v.id in places:
            state += f" ({places[v.id].short()})"
        table.add_row(str(v.id), state, str(v.attempt_count), v.grade or "", queries.prompt_origin(v), v.concept)
    return Group(header, bar, table)


@click.command()
@click.option("--batch", type=ID, default=None, help="Only this batch's videos.")
@click.option("--limit", type=LIMIT, default=50, show_default=True)
@click.pass_obj
def videos(settings: Settings, batch: int | None, limit: int) -> None:
    """List finished and running videos with their grades and files."""
    from mas.reports import queries

    ready(settings)
    rows = queries.recent_videos(settings, batch=batch, limit=limit)
    if not rows:
        console.print("no videos yet" if batch is None else f"batch {batch} has no videos")
        return
    table = Table("video", "batch", "state", "grade", "attempts")
    for v in rows:
        table.add_row(str(v.id), str(v.batch_id), v.state.value, v.grade or "", str(v.attempt_count))
    console.print(table)
    print_files(settings, rows)
    print_whole(f"videos are stored {storage(settings).where()}")


COMMANDS = [status, videos]
