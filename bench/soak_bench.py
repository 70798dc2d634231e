"""Soak benchmark: one long batch with faults injected on a schedule, against the same batch without faults.

A real studio (embedded PostgreSQL and Redis, a cpu worker with 2 processes, one gpu worker, beat) renders
through the ComfyUI protocol stand-in of the test suite (`tests.comfyui_server`: fault injection; it counts
executions per prompt id, so duplicated renders are counted by the render server itself). Every threshold
is scaled down with the short renders (lease heartbeat and expiry, reconcile interval and age, render time
limit). Faults, one every `--fault-every` seconds from the start: the gpu worker SIGKILLed (twice), the
cpu worker SIGKILLed, Redis stopped and started again, PostgreSQL stopped and started again, one render
that hangs until its time limit. (Videos finish late in a batch, since the gpu worker renders a run of
attempts before it grades them, so faults are timed, not tied to finished videos.) Reported: videos lost (not final at the end), renders duplicated (executions beyond one per
attempt), videos wrongly failed (failed by a step error rather than by their grades), wall time.

    python bench/soak_bench.py --videos 200
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from harness import ROOT, command_line, machine, new_data_dir, remove_data_dir

import sqlalchemy as sa  # noqa: E402

from mas import db
from mas.runtime import services  # noqa: E402
from mas.models import Attempt, Batch, BatchStatus, Video, VideoState  # noqa: E402
from tests.comfyui_server import ComfyUIStandIn, Script  # noqa: E402
from tests.studio import IsolatedStudio  # noqa: E402

SCALED = dict(
    MAS_LEASE_HEARTBEAT_SECONDS="1", MAS_LEASE_EXPIRY_SECONDS="5", MAS_RECONCILE_EVERY_SECONDS="5",
    MAS_RECONCILE_AFTER_SECONDS="15", MAS_MAX_RENDER_SECONDS="20", MAS_VISIBILITY_TIMEOUT_SECONDS="60",
    MAS_STEP_RETRIES="2", MAS_COMFYUI_RETRIES="2",
)
FAULTS = ("kill gpu worker", "kill cpu worker", "restart redis", "restart postgres", "hang one render",
          "kill gpu worker")


@dataclass(kw_only=True)
class Outcome:
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


def run(*, videos: int, render_seconds: float, faults: bool, fault_every: float, timeout_s: float) -> Outcome:
    data_dir = new_data_dir("mas-soak-")
    normal = Script(steps=3, step_seconds=render_seconds / 3)
    served = data_dir / "served.mp4"
    from gpu.preview import PreviewRenderer

    PreviewRenderer()(prompt="red", negative_prompt="", seed=1, output=served, render_id="soak")
    with ComfyUIStandIn(video=served, script=normal) as server:
        workflow = data_dir / "workflow.json"
        workflow.write_text(json.dumps({
            "5222": {"class_type": "PrimitiveStringMultiline", "inputs": {"value": "placeholder"}},
            "5232:5158": {"class_type": "RandomNoise", "inputs": {"noise_seed": 0}},
            "5075": {"class_type": "SaveVideo", "inputs": {"filename_prefix": "LTX_2"}},
        }))
        env = dict(MAS_VIDEO_BACKEND="comfyui", MAS_COMFYUI_WORKFLOW=str(workflow), MAS_COMFYUI_URL=server.url,
                   MAS_MAX_BATCH_VIDEOS=str(max(videos, 100)), **SCALED)
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
                        cpu, gpu = _inject(fault, studio, server, cpu=cpu, gpu=gpu, normal=normal)
                    time.sleep(0.5)
                wall = time.monotonic() - started
                done = _safe(lambda: studio.batch_done(batch_id)) or False
                if not done:
                    _say_where_it_stands(studio, batch_id)
                return _outcome(studio, server, batch_id, videos=videos, wall=wall, faults=faults, done=done)
        finally:
            remove_data_dir(studio.settings, data_dir)


def _say_where_it_stands(studio, batch_id: int) -> None:
    """A batch that did not finish: its videos by state and attempt, and the end of each worker's log."""
    with db.session_scope(studio.settings) as s:
        where = s.execute(sa.select(Video.state, Video.attempt_count, sa.func.count()).where(
            Video.batch_id == batch_id).group_by(Video.state, Video.attempt_count)).all()
    print("  not finished; videos by (state, attempt):", {(st.value, n): c for st, n, c in where}, flush=True)
    for worker in studio.workers:
        tail = worker.log.read_text().splitlines()[-15:]
        print(f"  --- {worker.log.name}:", *tail, sep="\n    ", flush=True)


def _inject(fault: str, studio, server, *, cpu, gpu, normal: Script):
    if fault == "kill gpu worker":
        gpu.kill()
        gpu = studio.worker("gpu")
    elif fault == "kill cpu worker":
        cpu.kill()
        cpu = studio.worker("cpu", concurrency=2)
    elif fault == "restart redis":
        services.stop_redis(studio.settings)
        time.sleep(2)
        services.start_redis(studio.settings)
    elif fault == "restart postgres":
        services.stop_postgres(studio.settings)
        time.sleep(3)
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


def _outcome(studio, server, batch_id: int, *, videos: int, wall: float, faults: bool, done: bool) -> Outcome:
    with db.session_scope(studio.settings) as s:
        rows = list(s.scalars(sa.select(Video).where(Video.batch_id == batch_id)))
        attempts = list(s.scalars(sa.select(Attempt).join(Video).where(Video.batch_id == batch_id)))
        assert s.get(Batch, batch_id).status in (BatchStatus.done, BatchStatus.running)
    final = (VideoState.accepted, VideoState.failed)
    # a render retried after it failed runs again under its prompt id; one that finished twice was duplicated
    counts = [server.successes[a.render_id] for a in attempts if a.render_id]
    return Outcome(
        faults=faults, videos=videos, wall_s=wall, done=done,
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


def report(rows: list[Outcome], args: argparse.Namespace, command: str) -> str:
    out = [
        "# Soak benchmark: a long batch with faults injected, against the same batch without\n",
        f"- date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- command: `{command}`",
        f"- machine: {machine()}",
        f"- renders: ComfyUI protocol stand-in (fault injection), {args.render_seconds} s of simulated work each; "
        f"thresholds scaled: {', '.join(f'{k}={v}' for k, v in SCALED.items())}",
        f"- faults, one every {args.fault_every:g} s from the start: {'; '.join(FAULTS)}",
        "",
        "| run | videos | finished | lost | renders duplicated | wrongly failed | attempts | ComfyUI executions | wall |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(f"| {'with faults' if r.faults else 'no faults'} | {r.videos} | {'yes' if r.done else 'NO'} | "
                   f"{r.lost} | {r.duplicated} | {r.wrongly_failed} | {r.attempts} | {r.executions} | {r.wall_s:.0f} s |")
    clean, faulty = rows[0], rows[-1]
    if faulty.faults and not clean.faults:
        out.append(f"\nWall time with faults: {faulty.wall_s / clean.wall_s:.2f} x the run without.")
    for r in rows:
        for reason in r.failed_by_error:
            out.append(f"\n- wrongly failed ({'with' if r.faults else 'no'} faults): {reason}")
    out.append("\nGoal: 0 lost, 0 duplicated, 0 wrongly failed. Executions beyond attempts that are not duplicates "
               "are renders that did not finish (the hanging one, renders interrupted by a killed worker's time "
               "limit) and ran again under the same prompt id.")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--videos", type=int, default=200)
    parser.add_argument("--render-seconds", type=float, default=0.3)
    parser.add_argument("--fault-every", type=float, default=60, help="seconds between two faults")
    parser.add_argument("--timeout", type=float, default=3600, help="give a run up after this many seconds")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "RESULTS-soak.md")
    args = parser.parse_args(argv)
    command = command_line(__file__)
    rows = []
    for faults in (False, True):
        print(f"run {'with' if faults else 'without'} faults: {args.videos} videos", flush=True)
        rows.append(run(videos=args.videos, render_seconds=args.render_seconds, faults=faults,
                        fault_every=args.fault_every, timeout_s=args.timeout))
        print(f"  {rows[-1]}", flush=True)
    args.output.write_text(report(rows, args, command))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
