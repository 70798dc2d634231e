"""Three-host benchmark: one batch across three hosts without faults, then the same batch broken three ways.

The test harness's `Topology` of THREE_HOSTS (tests/harness/topology.py): Debian's redis-server, pgserver's
PostgreSQL 16 + pgvector (a login role that is not a superuser) and a SeaweedFS bucket on host A with the gpu
worker and beat; a cpu worker on each of hosts B and C (network namespaces, no shared filesystem); renders of 2 s
and agent calls of 1 s (the preview renderer and the offline agents with simulated durations), every threshold
scaled with them. Faults, one after the other: Redis down for a few seconds, host B cut off the network in the
middle of a step and let back, the gpu worker SIGKILLed mid-render and started again, then `mas recover`.
Reported: wall time of each run, the difference (the goal: under 60 s), and per fault the seconds until the work
it hit moved on (Redis: from its return to the next accepted video; the cut: from the cut until the steps B held
were done elsewhere; the gpu worker: from its start again until its renders were done again, where the figures to
2026-11-26 counted from its death). Needs root.

    python bench/hosts_bench.py --videos 16
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from harness import command_line, machine

from tests.harness.processes import hosts_unavailable
from tests.harness.topology import CUT_S, REDIS_DOWN_S, SCALED, Topology


def run(*, videos: int, faults: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="mas-hosts-") as tmp, Topology(Path(tmp)) as studio:
        started = time.monotonic()
        batch_id = studio.enqueue(videos)
        recovery = studio.break_it(batch_id, videos) if faults else {}
        studio.wait_accepted(batch_id, videos, timeout=900)
        wall = time.monotonic() - started
        renders = studio.renders()
        twice = sorted(attempt for attempt, count in renders.items() if count > 1)
        return {"wall": wall, "recovery": recovery, "renders": sum(renders.values()), "twice": twice,
                "accepted": studio.accepted(batch_id)}  # fmt: skip


def report(*, videos: int, calm: dict, broken: dict) -> str:
    scaled = ", ".join(f"{k}={v}" for k, v in SCALED.items())
    lines = [
        "# Three hosts: a batch with Redis restarted, a host cut off and a gpu worker killed, against the same batch "
        "without",
        "",
        f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        f"- command: `{command_line(__file__)}`",
        f"- machine: {machine()}",
        "- hosts: A (Debian's redis-server, pgserver's PostgreSQL 16 + pgvector as a non-superuser role, SeaweedFS, "
        "the gpu worker, beat), B and C (a cpu worker each, 2 processes); network namespaces on one machine",
        f"- work: preview renders and offline agents with simulated durations; {scaled}",
        f"- faults: Redis down {REDIS_DOWN_S} s; host B cut off mid-step for {CUT_S} s; the gpu worker SIGKILLed "
        "mid-render, started again, `mas recover`",
        "",
        "| run | videos | accepted | renders run to the end | attempts rendered twice | wall |",
        "|---|---|---|---|---|---|",
        *(
            f"| {name} | {videos} | {run['accepted']} | {run['renders']} | {', '.join(run['twice']) or 'none'} | "
            f"{run['wall']:.1f} s |"
            for name, run in (("no faults", calm), ("with faults", broken))
        ),
        "",
        f"Wall with faults minus without: {broken['wall'] - calm['wall']:.1f} s (goal: under 60 s).",
        "",
        "| fault | seconds until the work it hit moved on |",
        "|---|---|",
        *(f"| {fault} | {seconds:.1f} |" for fault, seconds in broken["recovery"].items()),
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--videos", type=int, default=16)
    parser.add_argument("--output", type=Path, help="Write the report at the top of this file.")
    args = parser.parse_args()
    if reasons := hosts_unavailable():
        raise SystemExit("; ".join(reasons))
    calm = run(videos=args.videos, faults=False)
    broken = run(videos=args.videos, faults=True)
    text = report(videos=args.videos, calm=calm, broken=broken)
    print(text)
    if args.output:
        earlier = args.output.read_text() if args.output.exists() else ""
        args.output.write_text(text + ("\n## Earlier runs\n\n" + earlier if earlier else ""))


if __name__ == "__main__":
    main()
