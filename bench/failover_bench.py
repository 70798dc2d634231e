"""Failover benchmark: one batch across five hosts without faults, then with the database's primary, the broker's
master, or both killed, under asynchronous and synchronous replication.

The studio of `tests/failover_hosts.py`: PostgreSQL's primary on host D and its streaming standby on host E,
a Redis master on D and its replica on E with a Sentinel on each of D, E and A, SeaweedFS, the gpu worker and
beat on A, a cpu worker on each of B and C (network namespaces on one machine); renders of 2 s and agent calls
of 1 s. Faults: once 3 videos are accepted the primary's processes are SIGKILLed and, after a 2 s detection
delay, the standby promoted with `pg_ctl promote`; two accepted videos later (or at 3 without the first fault)
the Redis master is SIGKILLed and the Sentinels promote its replica. Reported per run: the wall time against
the fault-free run's, per death the seconds until a step started again and until the batch ended, the WAL the
standby lacked (the primary's last seen insert position minus the standby's replay position at promotion),
the acknowledged probe commits lost, the steps whose committed result was lost (and so ran again) and the
steps committed twice. Needs root.

    python bench/failover_bench.py --videos 16 --output bench/RESULTS-failover.md
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from harness import command_line, machine

from tests.failover_hosts import DETECT_S, FailoverHosts, Ride, ride
from tests.hosts import namespaces_available, postgres_available, redis_server_available
from tests.three_hosts import SCALED

RUNS = (  # name, synchronous replication, kill the primary, kill the master
    ("no faults", False, False, False),
    ("primary killed, async", False, True, False),
    ("master killed", False, False, True),
    ("both killed, async", False, True, True),
    ("primary killed, sync", True, True, False),
    ("both killed, sync", True, True, True),
)


def run(*, videos: int, sync: bool, primary: bool, master: bool) -> Ride:
    with tempfile.TemporaryDirectory(prefix="mas-failover-") as tmp, FailoverHosts(Path(tmp), sync=sync) as studio:
        assert studio.replication_state() == ("sync" if sync else "async")
        return ride(studio, videos, primary=primary, master=master, timeout=900)


def _versions() -> str:
    from tests.hosts import REDIS_SERVER, _pg_bin

    postgres = subprocess.run([str(_pg_bin() / "postgres"), "--version"], capture_output=True, text=True).stdout
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--videos", type=int, default=16)
    parser.add_argument("--output", type=Path, help="Write the report at the top of this file.")
    args = parser.parse_args()
    for reason in (namespaces_available(), redis_server_available(), postgres_available()):
        if reason:
            raise SystemExit(reason)
    results = {}
    for name, sync, primary, master in RUNS:
        results[name] = run(videos=args.videos, sync=sync, primary=primary, master=master)
        print(f"{name}: {results[name].wall:.1f} s", flush=True)
    text = report(videos=args.videos, results=results)
    print(text)
    if args.output:
        earlier = args.output.read_text() if args.output.exists() else ""
        args.output.write_text(text + ("\n## Earlier runs\n\n" + earlier if earlier else ""))


if __name__ == "__main__":
    main()
