"""Failover benchmark: one batch across five hosts without faults, then with the database's primary, the broker's
master, or both killed, under asynchronous and synchronous replication.

The test harness's `Topology` of FIVE_HOSTS (tests/harness/topology.py): PostgreSQL's primary on host D and its
streaming standby on host E, a Redis master on D and its replica on E with a Sentinel on each of D, E and A,
SeaweedFS, the gpu worker and beat on A, a cpu worker on each of B and C (network namespaces on one machine);
renders of 2 s and agent calls of 1 s. Faults: once 3 videos are accepted the primary's processes are SIGKILLed
and, after a 2 s detection delay, the standby promoted with `pg_ctl promote`; two accepted videos later (or at 3
without the first fault) the Redis master is SIGKILLed and the Sentinels promote its replica. Reported per run:
the wall time against the fault-free run's, per death the seconds until a step started again and until the batch
ended, the WAL the standby lacked (the primary's last seen insert position minus the standby's replay position at
promotion), the acknowledged probe commits lost, the steps whose committed result was lost (and so ran again) and
the steps committed twice. Needs root.

With `--long-render SECONDS` it runs instead a few videos whose renders take that long, the primary killed while
one renders (its progress, which the gpu worker publishes on Redis, says how far it is: a quarter in, then in its
last frame, so that it ends while the database is away), the standby promoted as above. Reported from the gpu
worker's record of its GPU turns and the workers' logs: the renders started against the videos, each render's
span, whether the render running at the death ran once and was recorded once, any `LeaseHeld` for a render
after the death, and the GPU time thrown away: the seconds of every render turn whose result was not the one
recorded (a render aborted, or run again).

    python bench/failover_bench.py --videos 16 --output bench/RESULTS-failover.md
    python bench/failover_bench.py --long-render 20 --videos 3 --output bench/RESULTS-failover.md
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from harness import command_line, machine

from gpu.preview import PreviewRenderer
from mas.names import PROGRESS_CHANNEL_PREFIX, gpu_stats_key
from tests.harness.failover import DETECT_S, DatabaseFailover, Ride, ride
from tests.harness.processes import REDIS_SERVER, hosts_unavailable, pg_bin, wait_for
from tests.harness.topology import FIVE_HOSTS, SCALED, Topology

RUNS = (  # name, synchronous replication, kill the primary, kill the master
    ("no faults", False, False, False),
    ("primary killed, async", False, True, False),
    ("master killed", False, False, True),
    ("both killed, async", False, True, True),
    ("primary killed, sync", True, True, False),
    ("both killed, sync", True, True, True),
)


def run(*, videos: int, sync: bool, primary: bool, master: bool) -> Ride:
    layout = replace(FIVE_HOSTS, sync=sync)
    with tempfile.TemporaryDirectory(prefix="mas-failover-") as tmp, Topology(Path(tmp), layout) as studio:
        assert studio.database.replication_state() == ("sync" if sync else "async")
        return ride(studio, videos, primary=primary, master=master, timeout=900)


def _versions() -> str:
    postgres = subprocess.run([str(pg_bin() / "postgres"), "--version"], capture_output=True, text=True).stdout
    redis = subprocess.run([REDIS_SERVER, "--version"], capture_output=True, text=True).stdout.split()
    return f"{postgres.strip()}; Redis {next((w[2:] for w in redis if w.startswith('v=')), '?')}"


def _commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()


def _row(name: str, result: Ride, calm: float) -> str:
    database = result.database
    deaths = " / ".join(f"{fault} {result.moving[fault]:.1f} s" for fault in result.moving) or "-"
    ends = " / ".join(f"{fault} {result.to_end[fault]:.1f} s" for fault in result.to_end) or "-"
    lost = (f"{database.lsn_gap} B / {database.probes_lost}" if database else "-")  # fmt: skip
    redone = ", ".join(f"{step} of video {v} attempt {a}" for v, a, step in sorted(result.lost)) or "none"
    twice = ", ".join(f"{step} of video {v} attempt {a}" for v, a, step in sorted(result.again)) or "none"
    return (
        f"| {name} | {result.accepted} | {result.wall:.1f} s | {result.wall - calm:+.1f} s | {deaths} | {ends} | "
        f"{lost} | {redone} | {twice} |"
    )


def report(*, videos: int, results: dict[str, Ride]) -> str:
    calm = results["no faults"].wall
    scaled = ", ".join(f"{k}={v}" for k, v in SCALED.items())
    return "\n".join([
        "# Failover across hosts: a batch while PostgreSQL's primary, Redis's master or both are killed",
        "",
        f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; commit {_commit()}",
        f"- command: `{command_line(__file__)}`",
        f"- machine: {machine()}",
        f"- versions: {_versions()}",
        "- hosts: D (PostgreSQL primary, Redis master, a Sentinel), E (streaming standby, Redis replica, a Sentinel), "
        "A (a Sentinel, SeaweedFS, the gpu worker, beat), B and C (a cpu worker each); network namespaces on one machine",
        f"- work: {videos} videos; preview renders and offline agents with simulated durations; {scaled}",
        f"- faults: the primary SIGKILLed once 3 videos are accepted, the standby promoted (`pg_ctl promote`) after "
        f"{DETECT_S:.0f} s of detection; the Redis master SIGKILLed two accepted videos later (3 without the first "
        "fault), the Sentinels (down-after 1 s) promoting the replica; sync: `synchronous_standby_names` naming the "
        "standby, `synchronous_commit = on` (pg_stat_replication said `sync` before the kill)",
        "",
        "| run | accepted | wall | against no faults | death to a step starting | death to the batch's end | "
        "WAL lost / acknowledged probe commits lost | steps whose committed result was lost (ran again) | "
        "steps committed twice |",
        "|---|---|---|---|---|---|---|---|---|",
        *(_row(name, result, calm) for name, result in results.items()),
        "",
        "WAL lost: the primary's last seen `pg_current_wal_insert_lsn()` (sampled every ~10 ms up to the kill) minus "
        "the standby's `pg_last_wal_replay_lsn()` at promotion, a lower bound. Probe commits: a superuser's commits "
        "to a table of the `postgres` database, acknowledged by the primary, missing on the new one. Steps: results "
        "a worker had committed (its log says so before the promotion) that the new primary lacked.",
        "",
    ])  # fmt: skip


# --- long renders: the primary killed while one runs ---------------------------------------------------------

FRAMES = PreviewRenderer.frames  # a preview render reports its progress once per frame
LONG_RUNS = (  # name, the frames a render has done when the primary is killed
    ("killed a quarter into a render", FRAMES // 4),
    ("killed in a render's last frame", FRAMES - 1),
)
_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}):")
_RENDER_TURN = re.compile(r"render of video (\d+) attempt (\d+)$")
NOTES = {  # what the logs say after the death, counted per kind
    "LeaseHeld for a render": re.compile(r"LeaseHeld.*render of video|render of video \d+ attempt \d+ is held"),
    "cancellation poll unanswered, render went on": re.compile(r"render of video \d+ goes on: cannot ask"),
    "record waited for the database": re.compile(r"waits \d+ s more for the database to record"),
    "lease not released yet": re.compile(r"lease not released yet"),
    "lease taken back": re.compile(r"its lease taken back by this worker"),
    "lease taken over": re.compile(r"was taken over"),
    "re-sent by reconcile": re.compile(r"reconcile: .*re-sent videos \[\d"),
}


@dataclass
class RenderTurn:
    """One render's hold of the GPU, from the gpu worker's own record (wall-clock seconds)."""

    video: int
    attempt: int
    start: float
    end: float
    used: bool = False  # its result is the one recorded

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class LongRide:
    """A batch of long renders through the primary's death: what the renders cost."""

    wall: float
    videos: int
    accepted: int
    database: DatabaseFailover
    hit: tuple[int, int]  # video, attempt of the render whose progress triggered the kill
    turns: list[RenderTurn]
    rendered: Counter[tuple[int, int]]  # "rendered in" lines per video and attempt
    recorded: Counter[tuple[int, int]]  # "recorded" lines of the render step
    notes: Counter[str] = field(default_factory=Counter)  # NOTES seen after the death

    @property
    def thrown_away(self) -> float:
        return sum(turn.seconds for turn in self.turns if not turn.used)

    @property
    def hit_turns(self) -> list[RenderTurn]:
        return [turn for turn in self.turns if (turn.video, turn.attempt) == self.hit]


def _render_at(pubsub, frame: int) -> tuple[int, int]:
    """Wait for a render's progress report of `frame` frames done; its video and attempt."""
    found: list[tuple[int, int]] = []

    def reached() -> bool:
        message = pubsub.get_message(timeout=0.5)
        data = json.loads(message["data"])["data"] if message else {}
        if data.get("step") == "render" and data.get("done", 0) >= frame:
            found.append((int(data["video_id"]), int(data["attempt"])))
        return bool(found)

    wait_for(reached, timeout=600, what=f"a render at frame {frame}", interval=0)
    return found[0]


def _turns(studio: Topology, batch_id: int) -> list[RenderTurn]:
    """The render turns of the gpu worker (its stats, published after each of its tasks), once they include the
    grading of every accepted video: the batch's last GPU work."""
    query = "select array_agg(id) from videos where batch_id = :b and state = 'accepted'"
    accepted = set(studio.scalar(query, b=batch_id) or [])
    record: list[list] = []

    def complete() -> bool:
        with studio.sentinels.master().client(timeout=5) as client:
            raw = client.get(gpu_stats_key(studio.gpu.name))
        record[:] = json.loads(raw)["recent_turns"] if raw else []
        graded = {int(m.group(1)) for *_, what in record if (m := re.match(r"grading of video (\d+)", what))}
        return accepted <= graded

    wait_for(complete, timeout=60, what="the gpu worker's record of every grading", interval=0.5)
    return [
        RenderTurn(int(m.group(1)), int(m.group(2)), start, end)
        for start, end, what in record if (m := _RENDER_TURN.fullmatch(what))
    ]  # fmt: skip


def _notes(studio: Topology, since: datetime) -> Counter[str]:
    found: Counter[str] = Counter()
    for log in studio.logs():
        for line in log.read_text(errors="replace").splitlines():
            stamp = _STAMP.match(line)
            if stamp is None or datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").astimezone(UTC) < since:
                continue
            found.update(name for name, pattern in NOTES.items() if pattern.search(line))
    return found


def long_ride(*, videos: int, render_s: float, frame: int) -> LongRide:
    """`videos` videos whose renders take `render_s`; the primary killed once a render has done `frame` frames."""
    env = {"MAS_PREVIEW_RENDER_SECONDS": f"{render_s:g}"}
    with (
        tempfile.TemporaryDirectory(prefix="mas-failover-") as tmp,
        Topology(Path(tmp), FIVE_HOSTS, env=env) as studio,
    ):
        with studio.sentinels.master().client(timeout=5) as client, client.pubsub(ignore_subscribe_messages=True) as pubsub:
            pubsub.psubscribe(PROGRESS_CHANNEL_PREFIX + "*")  # before the batch: its first report is not missed
            started = time.monotonic()
            batch_id = studio.enqueue(videos)
            hit = _render_at(pubsub, frame)
        database = studio.kill_primary()
        studio.wait_accepted(batch_id, videos, timeout=600)
        wall = time.monotonic() - started
        if studio.gpu.proc.poll() is not None:  # its record of turns would have started again with a new process
            raise RuntimeError(f"the gpu worker exited: {studio.gpu.log.read_text()[-3000:]}")
        turns = _turns(studio, batch_id)
        recorded = studio.recorded()
        last_record = {(v, a): max(times).timestamp() for (v, a, step), times in recorded.items() if step == "render"}
        for key, when in last_record.items():  # the result recorded: the last turn that ended before its record
            ended = [t for t in turns if (t.video, t.attempt) == key and t.end <= when]
            if ended:
                max(ended, key=lambda t: t.end).used = True
        rendered = Counter(
            (int(v), int(a)) for log in studio.logs()
            for v, a in re.findall(r"render of video (\d+) attempt (\d+) rendered in", log.read_text(errors="replace"))
        )  # fmt: skip
        return LongRide(
            wall=wall, videos=videos, accepted=studio.accepted(batch_id), database=database, hit=hit, turns=turns,
            rendered=rendered,
            recorded=Counter({(v, a): len(times) for (v, a, step), times in recorded.items() if step == "render"}),
            notes=_notes(studio, database.killed_at),
        )  # fmt: skip


def _long_row(name: str, result: LongRide) -> str:
    killed, promoted = result.database.killed_at.timestamp(), result.database.promoted_at.timestamp()
    video, attempt = result.hit
    hit = result.hit_turns
    spans = "; ".join(f"{t.start - killed:+.1f} to {t.end - killed:+.1f} s" for t in hit)  # relative to the death
    once = len(hit) == 1 and result.rendered[result.hit] == 1 and result.recorded[result.hit] == 1 and hit[0].used
    held = result.notes["LeaseHeld for a render"]
    return (
        f"| {name} | {result.accepted}/{result.videos} | {result.wall:.1f} s | {promoted - killed:.1f} s | "
        f"video {video} attempt {attempt}: {spans} | {len(hit)} / {result.rendered[result.hit]} / "
        f"{result.recorded[result.hit]} ({'once' if once else 'NOT once'}) | {len(result.turns)} for "
        f"{result.videos} videos | {held} | {result.thrown_away:.1f} s |"
    )


def _long_detail(name: str, result: LongRide) -> list[str]:
    killed = result.database.killed_at.timestamp()
    turns = ", ".join(
        f"video {t.video} attempt {t.attempt} {t.start - killed:+.1f} to {t.end - killed:+.1f} s "
        f"({t.seconds:.1f} s, {'recorded' if t.used else 'THROWN AWAY'})"
        for t in sorted(result.turns, key=lambda t: t.start)
    )  # fmt: skip
    notes = ", ".join(f"{kind}: {count}" for kind, count in sorted(result.notes.items())) or "none"
    return [f"- {name}: render turns (from the death) {turns}. After the death the logs say: {notes}."]


def long_report(*, videos: int, render_s: float, results: dict[str, LongRide]) -> str:
    scaled = ", ".join(f"{k}={v}" for k, v in {**SCALED, "MAS_PREVIEW_RENDER_SECONDS": f"{render_s:g}"}.items())
    frame_s = render_s / FRAMES
    return "\n".join([
        "# Failover with long renders: the primary killed while a render runs",
        "",
        f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; commit {_commit()} (with the work tree's uncommitted "
        "changes)",
        f"- command: `{command_line(__file__)}`",
        f"- machine: {machine()}",
        f"- versions: {_versions()}",
        "- hosts: as above (D: primary, E: standby, A: the gpu worker, beat; B, C: cpu workers)",
        f"- work: {videos} videos, preview renders of {render_s:g} s ({FRAMES} frames of {frame_s:.2f} s) and "
        f"offline agents with simulated durations; {scaled}; MAS_MAX_RENDER_SECONDS, MAS_GPU_LOOKAHEAD and "
        "MAS_DATABASE_WAIT_SECONDS at their defaults (1800, 1, 60); asynchronous replication",
        f"- fault: the primary SIGKILLed when a render's progress (published by the gpu worker on Redis) reports "
        f"{LONG_RUNS[0][1]} frames done (run 1: {LONG_RUNS[0][1] * frame_s:.1f} s in) or {LONG_RUNS[1][1]} (run 2: "
        f"{LONG_RUNS[1][1] * frame_s:.1f} s in, so that it ends while the database is away), the standby promoted "
        f"after {DETECT_S:.0f} s of detection",
        "",
        "| run | accepted | wall | death to promotion | the render at the death: its turns on the GPU (from the death) "
        "| its turns / `rendered in` / `recorded` | renders started (GPU turns) | `LeaseHeld` for a render after the "
        "death | GPU time thrown away |",
        "|---|---|---|---|---|---|---|---|---|",
        *(_long_row(name, result) for name, result in results.items()),
        "",
        *(line for name, result in results.items() for line in _long_detail(name, result)),
        "",
        "Renders: the gpu worker's record of its GPU turns (start and end of each, published with its stats), one "
        "per render started, aborted or not. A turn's result is used when it is the last turn of its video and "
        "attempt to end before that render's `recorded` log line (its result committed); GPU time thrown away is "
        "the sum of the other render turns. `LeaseHeld` and the other notes: lines of every worker's and beat's "
        "log stamped after the death.",
        "",
    ])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--videos", type=int, help="Videos per batch (16; 3 with --long-render).")
    parser.add_argument("--long-render", type=float, metavar="SECONDS",
                        help="Renders of SECONDS, the primary killed while one runs (see above).")  # fmt: skip
    parser.add_argument("--output", type=Path, help="Write the report at the top of this file (--long-render: "
                        "at its end).")  # fmt: skip
    args = parser.parse_args()
    if reasons := hosts_unavailable():
        raise SystemExit("; ".join(reasons))
    if args.long_render:
        long_runs(videos=args.videos or 3, render_s=args.long_render, output=args.output)
        return
    videos = args.videos or 16
    results = {}
    for name, sync, primary, master in RUNS:
        results[name] = run(videos=videos, sync=sync, primary=primary, master=master)
        print(f"{name}: {results[name].wall:.1f} s", flush=True)
    text = report(videos=videos, results=results)
    print(text)
    if args.output:
        earlier = args.output.read_text() if args.output.exists() else ""
        args.output.write_text(text + ("\n## Earlier runs\n\n" + earlier if earlier else ""))


def long_runs(*, videos: int, render_s: float, output: Path | None) -> None:
    results = {}
    for name, frame in LONG_RUNS:
        results[name] = long_ride(videos=videos, render_s=render_s, frame=frame)
        print(f"{name}: {results[name].wall:.1f} s, {results[name].thrown_away:.1f} s thrown away", flush=True)
    text = long_report(videos=videos, render_s=render_s, results=results)
    print(text)
    if output:
        earlier = output.read_text() if output.exists() else ""
        output.write_text(earlier.rstrip("\n") + "\n\n" + text if earlier else text)


if __name__ == "__main__":
    main()
