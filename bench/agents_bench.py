"""Do the agents keep the GPU fed? A batch of videos through the llm agents at a set call latency and a real
ComfyUI, with 1, 2 and 4 cpu worker processes.

The agents talk to `bench/llm_standin.py`, an LLM LATENCY STAND-IN (not a model): every call is answered
after L seconds with a valid reply, so the run measures how the studio overlaps agent calls with renders,
not a model's quality. Videos are rendered by a real ComfyUI 0.3.75 (`tests/comfyui_real.py`: a weightless
timed workflow, one render = `--render-seconds` of ComfyUI's time) driven by one gpu worker started as the
tests start it, and graded by the preview grader. PostgreSQL and Redis are the studio's embedded ones, in a
fresh data folder per configuration; one `mas` cpu worker runs with `-c N` (N processes).

Reported per configuration: wall from the request to the batch done (the database's own times); ComfyUI's
busy fraction from its /history timestamps (render time / first start to last end, and / wall); accepted
videos per minute; time from the request to the first accepted video (the Video rows); the most calls in
flight per role and overall and the calls served (the stand-in's /stats); accepted and failed videos. The
ideal wall is `plan + write + N renders + grade + review` (agent calls at their measured median, renders at
ComfyUI's measured median, the grade at the gpu worker's measured median), the ideal first accepted video
`plan + write + render + grade + review`.

    python bench/agents_bench.py --label before            # L = 0.2, 2, 5 s x 1, 2, 4 processes, 12 videos
    python bench/agents_bench.py --delays 2 --procs 2 --videos 4 --no-write
    python bench/agents_bench.py --real-llm --label before  # 3 videos on llama.cpp's server with SmolLM2

`--real-llm` runs instead the real local model (`tests/llm_server.py`: llama.cpp's server, SmolLM2-135M):
tokens per video and the share of prompt tokens llama.cpp served from its prompt cache (read from its log,
the only place it says so). The report goes into bench/RESULTS-agents.md between the markers of `--label`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _path in (str(ROOT), str(ROOT / "bench")):
    if _path not in sys.path:
        sys.path.insert(0, _path)


def _announce() -> None:
    """Which `mas` this process runs (workers import this module with `-I` so their log says it too)."""
    import mas

    print(f"agents_bench: pid {os.getpid()} runs mas from {Path(mas.__file__).parent}", file=sys.stderr, flush=True)


_announce()

RESULTS = ROOT / "bench" / "RESULTS-agents.md"
REQUEST = "Create {n} videos of mythical creatures"
VALID = re.compile(  # the log line of a validated call; "N cached" and conversation names (writer.2) came later
    r"llm ([\w.]+) (\w+): valid reply after (\d+) tries in ([\d.]+) s \((\d+)\+(\d+) tokens(?:, \d+ cached)?, (\w+)\)"
)
INVALID = re.compile(r"llm ([\w.]+) (\w+): reply \d+ invalid")
ANNOUNCED = re.compile(r"agents_bench: pid \d+ runs mas from (\S+)")
ROLE_ORDER = ("director", "writer", "cameraman", "sleeptime")


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def fmt(value: float | None, spec: str = ".1f", unit: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"


# --- one configuration --------------------------------------------------------------------------------
def studio_env(
    data_dir: Path,
    *,
    comfy_url: str,
    llm_url: str,
    model: str,
    procs: int,
    render_seconds: float,
    videos: int,
    min_grade: str | None,
) -> dict[str, str]:
    from tests.comfyui_real import NODE_MAP, write_workflow

    data_dir.mkdir(parents=True, exist_ok=True)
    env = {
        "MAS_VIDEO_BACKEND": "comfyui",
        "MAS_COMFYUI_URL": comfy_url,
        "MAS_COMFYUI_WORKFLOW": str(write_workflow(data_dir / "workflow.json", seconds=render_seconds)),
        "MAS_COMFYUI_NODES": json.dumps(NODE_MAP),
        "MAS_VIDEO_FRAMES": "8",
        "MAS_VIDEO_FPS": "12",
        "MAS_GPU_LOOKAHEAD": "1",
        "MAS_MAX_BATCH_VIDEOS": str(max(videos, 100)),
        "MAS_AGENT_BACKEND": "llm",
        "MAS_LLM_URL": llm_url,
        "MAS_LLM_MODEL": model,
        "MAS_AGENT_CONVERSATIONS": str(procs),
        "MAS_LLM_MAX_IN_FLIGHT": "16",
    }
    if min_grade:
        env["MAS_MIN_ACCEPTABLE_GRADE"] = min_grade
    return env


def batch_row(studio, batch_id: int):
    from mas import db
    from mas.models import Batch

    with db.session_scope(studio.settings) as session:
        batch = session.get(Batch, batch_id)
        return batch.status.value, batch.created_at.timestamp(), batch.updated_at.timestamp()


def wait_final(studio, batch_id: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if batch_row(studio, batch_id)[0] in ("done", "failed", "cancelled"):
                return True
        except Exception:
            pass
        time.sleep(0.3)
    return False


def gradings(studio, since: float) -> list[float]:
    """Seconds of each grading since `since`, from the gpu worker's record of its GPU turns."""
    from mas import names
    from mas.runtime.clients import redis_client

    client = redis_client(studio.settings)
    spans = []
    for key in client.scan_iter(match=names.GPU_STATS_PREFIX + "*"):
        for start, end, what in json.loads(client.get(key) or "{}").get("recent_turns", []):
            if start >= since and str(what).startswith("grading"):
                spans.append(end - start)
    return spans


def worker_calls(logs: str) -> list[tuple]:
    return [m.groups() for m in VALID.finditer(logs)]


def run_config(
    *,
    delay: float,
    procs: int,
    videos: int,
    llm,
    comfy,
    base: Path,
    render_seconds: float,
    timeout: float,
    min_grade: str | None,
) -> dict:
    import sqlalchemy as sa

    from bench.harness import remove_data_dir
    from mas import db
    from mas.models import Attempt, Video
    from tests.studio import IsolatedStudio

    data_dir = base / f"studio-L{delay:g}-c{procs}"
    env = studio_env(
        data_dir,
        comfy_url=comfy.url,
        llm_url=llm.url,
        model=llm.model,
        procs=procs,
        render_seconds=render_seconds,
        videos=videos,
        min_grade=min_grade,
    )
    studio = IsolatedStudio(data_dir / "studio", **env)
    studio.worker_args = ["-I", "bench.agents_bench"]
    result: dict = {"delay": delay, "procs": procs, "videos": videos, "finished": False, "timeout": timeout}
    try:
        with studio:
            cpu = studio.worker("cpu", concurrency=procs)
            studio.worker("gpu")
            try:  # each pool process loads the embedding model as it starts (tasks/warmup.py)
                studio.wait_until(
                    lambda: cpu.log.read_text().count("embedding model loaded") >= procs,
                    timeout=180,
                    what="the embedding model in every cpu process",
                )
            except TimeoutError:
                print("  (not every cpu process reported its embedding model loaded; going on)", flush=True)
            comfy.clear()
            llm.reset()
            batch_id = studio.enqueue(REQUEST.format(n=videos))
            result["finished"] = wait_final(studio, batch_id, timeout)
            status, asked_at, updated_at = batch_row(studio, batch_id)
            result.update(status=status, asked_at=asked_at, wall=updated_at - asked_at if result["finished"] else None)
            with db.session_scope(studio.settings) as s:
                rows = list(s.scalars(sa.select(Video).where(Video.batch_id == batch_id)))
                states = [(v.state.value, v.updated_at.timestamp()) for v in rows]
                attempts = list(s.scalars(sa.select(Attempt).join(Video).where(Video.batch_id == batch_id)))
                result["attempts"] = len(attempts)
                result["grades"] = sorted(a.grade or "-" for a in attempts)
                graded = [a.finished_at.timestamp() for a in attempts if a.finished_at]
                result["first_graded"] = min(graded) - asked_at if graded else None
            accepted = sorted(t for state, t in states if state == "accepted")
            result.update(
                accepted=len(accepted),
                failed=sum(st == "failed" for st, _ in states),
                unfinished=sum(st not in ("accepted", "failed", "cancelled") for st, _ in states),
                first_accepted=accepted[0] - asked_at if accepted else None,
            )
            renders = comfy.renders()
            spans = sorted((r.started, r.ended) for r in renders if r.status == "success" and r.ended)
            result["renders"] = len(spans)
            result["render_errors"] = sum(1 for r in renders if r.status != "success")
            if spans:
                busy = sum(e - s for s, e in spans)
                result.update(
                    render_median=median([e - s for s, e in spans]),
                    busy_time=busy,
                    busy_active=busy / (spans[-1][1] - spans[0][0]),
                    first_render=spans[0][0] - asked_at,
                    last_render=spans[-1][1] - asked_at,
                )
                if result["wall"]:
                    result["busy_wall"] = busy / result["wall"]
            result["grade_median"] = median(gradings(studio, asked_at))
            result["llm"] = llm.stats()
            logs = "".join(w.log.read_text(errors="replace") for w in studio.workers)
            calls = worker_calls(logs)
            result["agent_median"] = median([float(c[3]) for c in calls])
            result["invalid_replies"] = len(INVALID.findall(logs))
            result["worker_mas"] = sorted(set(ANNOUNCED.findall(logs)))
            result["load"] = os.getloadavg()[0]
    finally:
        remove_data_dir(studio.settings, data_dir)
    return result


def ideal(result: dict) -> tuple[float | None, float | None, float]:
    """(ideal wall, ideal first accepted, agent seconds used) from the run's measured medians."""
    agent = result.get("agent_median") or result["delay"]
    render, grade = result.get("render_median"), result.get("grade_median")
    if render is None or grade is None:
        return None, None, agent
    renders = max(result.get("renders") or 0, result["videos"])
    return agent + agent + renders * render + grade + agent, agent + agent + render + grade + agent, agent


# --- the report -----------------------------------------------------------------------------------
def row(r: dict) -> str:
    wall_ideal, first_ideal, _agent = ideal(r)
    stats = r.get("llm") or {}
    roles = stats.get("roles", {})
    in_flight = " / ".join(str(roles.get(role, {}).get("max_in_flight", 0)) for role in ROLE_ORDER)
    in_flight += f" / {stats.get('overall', {}).get('max_in_flight', 0)}"
    wall = fmt(r.get("wall"), ".1f") if r["finished"] else f"not done in {r['timeout']:.0f} s"
    ratio = f"{r['wall'] / wall_ideal:.2f}" if r.get("wall") and wall_ideal else "-"
    per_min = f"{60 * r['accepted'] / r['wall']:.1f}" if r.get("wall") else "-"
    return (
        f"| {r['delay']:g} | {r['procs']} | {r.get('status', '?')} | {wall} | {fmt(wall_ideal)} | {ratio} | "
        f"{fmt(100 * r['busy_active'] if 'busy_active' in r else None, '.0f', ' %')} | "
        f"{fmt(100 * r['busy_wall'] if 'busy_wall' in r else None, '.0f', ' %')} | {per_min} | "
        f"{fmt(r.get('first_accepted'))} | {fmt(first_ideal)} | {r.get('renders', 0)} | "
        f"{r.get('accepted', 0)} / {r.get('failed', 0)}"
        + (f" ({r['unfinished']} left)" if r.get("unfinished") else "")
        + f" | {stats.get('overall', {}).get('calls', 0)} | {in_flight} | {r.get('load', 0):.1f} |"
    )


TABLE_HEAD = (
    "| L s | cpu procs | batch | wall s | ideal s | wall / ideal | ComfyUI busy (first start to last end) | "
    "ComfyUI busy (of wall) | accepted / min | first accepted s | ideal first s | renders | accepted / failed | "
    "agent calls | max in flight: director / writer / cameraman / sleeptime / all | load (1 min) |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def detail_row(r: dict) -> str:
    stats = r.get("llm") or {}
    tokens, tasks = stats.get("tokens", {}), stats.get("tasks", {})
    n = max(r["videos"], 1)
    share = tokens.get("cached", 0) / tokens["prompt"] if tokens.get("prompt") else 0
    return (
        f"| {r['delay']:g} | {r['procs']} | {fmt(r.get('agent_median'), '.2f')} | "
        f"{fmt(r.get('render_median'), '.2f')} | "
        f"{fmt(r.get('grade_median'), '.3f')} | {fmt(r.get('first_render'))} | "
        f"{', '.join(f'{k} {v}' for k, v in sorted(tasks.items()))} | {r.get('invalid_replies', 0)} | "
        f"{tokens.get('prompt', 0) / n:.0f} | {tokens.get('completion', 0) / n:.0f} | {100 * share:.0f} % |"
    )


DETAIL_HEAD = (
    "| L s | cpu procs | agent call median s | render median s | grade median s | first render starts s | "
    "calls by task | invalid replies | prompt tokens / video | completion tokens / video | simulated cached share |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def reading(results: list[dict]) -> list[str]:
    """What the figures say, computed (the hand-written reading goes below it)."""
    lines = []
    done = [r for r in results if r.get("wall")]
    for r in results:
        if not r["finished"]:
            lines.append(  # noqa: PERF401
                f"- L = {r['delay']:g} s, {r['procs']} process(es): not done within {r['timeout']:.0f} s "
                f"({r.get('accepted', 0)} accepted, {r.get('failed', 0)} failed, {r.get('unfinished', 0)} "
                "still in progress)."
            )
    if done:
        worst = max(done, key=lambda r: r["wall"] / (ideal(r)[0] or r["wall"]))
        best = min(done, key=lambda r: r["wall"] / (ideal(r)[0] or r["wall"]))
        lines.append(
            f"- wall / ideal runs from {best['wall'] / ideal(best)[0]:.2f} (L = {best['delay']:g} s, "
            f"{best['procs']} process(es)) to {worst['wall'] / ideal(worst)[0]:.2f} (L = {worst['delay']:g} s, "
            f"{worst['procs']} process(es))."
        )
        for role in ROLE_ORDER:
            most = max(
                (r.get("llm", {}).get("roles", {}).get(role, {}).get("max_in_flight", 0) for r in done), default=0
            )
            lines.append(f"- most {role} calls in flight at once, over all configurations: {most}.")
        for delay in sorted({r["delay"] for r in done}):
            same = sorted((r for r in done if r["delay"] == delay), key=lambda r: r["procs"])
            walls = ", ".join(f"{r['procs']} -> {r['wall']:.0f} s" for r in same)
            lines.append(f"- L = {delay:g} s, wall by cpu processes: {walls}.")
    return lines


def section(label: str, body: list[str]) -> str:
    return "\n".join(
        [f"<!-- agents-bench:{label}:start -->", f"## {label}", "", *body, f"<!-- agents-bench:{label}:end -->"]
    )


def write_section(label: str, text: str) -> None:
    """Put `text` between the markers of `label` in RESULTS-agents.md, keeping every other section."""
    intro = (
        "# Do the agents keep the GPU fed?\n\nWritten by `bench/agents_bench.py`; each section is one labelled "
        "run (its command is in it). The agents' LLM is `bench/llm_standin.py`, a latency stand-in that is NOT a "
        "model (it answers every call after L seconds with a valid reply), except in the sections measured on "
        "the real llama.cpp server.\n"
    )
    current = RESULTS.read_text() if RESULTS.exists() else intro
    start, end = f"<!-- agents-bench:{label}:start -->", f"<!-- agents-bench:{label}:end -->"
    if start in current and end in current:
        head, rest = current.split(start, 1)
        current = head + text + rest.split(end, 1)[1]
    else:
        current = current.rstrip("\n") + "\n\n" + text + "\n"
    RESULTS.write_text(current if current.endswith("\n") else current + "\n")


def where(paths: set[str]) -> str:
    """Where the workers' `mas` came from, said without machine paths."""
    if not paths:
        return "not logged"
    if paths == {str(ROOT / "mas")}:
        return "the `mas/` of the checkout this bench ran from (the code line above)"
    return f"NOT only this checkout's `mas/` ({len(paths)} places)"


def code_line() -> str:
    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "mas", "tasks", "gpu")
    return f"Code: commit {commit}" + (
        " with uncommitted changes in mas/, tasks/ or gpu/" if dirty else " as committed"
    )


# --- the matrix -------------------------------------------------------------------------------------
def _run_matrix(args, base: Path, delays: list[float], procs: list[int], results: list[dict]) -> None:
    import httpx
    from llm_standin import StandIn

    from tests.comfyui_real import RealComfyUI, timed_workflow

    with RealComfyUI(base / "comfyui") as comfy:
        warm = timed_workflow(seconds=args.render_seconds)  # ComfyUI's first prompt loads its nodes: not measured
        httpx.post(comfy.url + "/prompt", json={"prompt": warm, "prompt_id": str(uuid.uuid4())}, timeout=30)
        while comfy.queue()["queue_running"] or comfy.queue()["queue_pending"]:
            time.sleep(0.2)
        for delay in delays:
            with StandIn(delay=delay, log=base / f"standin-{delay:g}.log") as llm:
                for n in procs:
                    timeout = args.timeout or 180 + args.videos * (6 * delay + 10 * args.render_seconds)
                    print(
                        f"L = {delay:g} s, cpu worker -c {n}: {args.videos} videos (at most {timeout:.0f} s)",
                        flush=True,
                    )
                    try:
                        result = run_config(
                            delay=delay,
                            procs=n,
                            videos=args.videos,
                            llm=llm,
                            comfy=comfy,
                            base=base,
                            render_seconds=args.render_seconds,
                            timeout=timeout,
                            min_grade=args.min_grade,
                        )
                    except Exception as exc:
                        result = {
                            "delay": delay,
                            "procs": n,
                            "videos": args.videos,
                            "finished": False,
                            "timeout": timeout,
                            "status": f"error: {type(exc).__name__}: {str(exc)[:200]}",
                        }
                    results.append(result)
                    print(TABLE_HEAD.splitlines()[0] + "\n" + row(result), flush=True)
                    print(
                        f"  workers ran mas from {result.get('worker_mas')}; grades {result.get('grades')}", flush=True
                    )
                    print("  raw " + json.dumps(result, default=str), flush=True)


def matrix(args) -> None:
    from bench.harness import command_line, machine, new_data_dir

    base = new_data_dir("mas-agents-bench-")
    delays = [float(d) for d in args.delays.split(",")]
    procs = [int(p) for p in args.procs.split(",")]
    results: list[dict] = []
    try:
        _run_matrix(args, base, delays, procs, results)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    body = [
        f"Machine: {machine()}",
        f"Command: `{command_line(__file__)}`",
        code_line(),
        f'Setup: `mas enqueue "{REQUEST.format(n=args.videos)}"` per configuration, a fresh studio each (embedded '
        f"PostgreSQL and Redis); one cpu worker `-c N`; one gpu worker (MAS_GPU_LOOKAHEAD=1) on a real ComfyUI 0.3.75 "
        f"whose timed render takes {args.render_seconds:g} s; preview grader; MAS_MIN_ACCEPTABLE_GRADE="
        f"{args.min_grade or 'default'}; MAS_AGENT_CONVERSATIONS=N and MAS_LLM_MAX_IN_FLIGHT=16 passed (code that "
        "does not know them ignores them). Agents on the LLM latency stand-in (not a model), L seconds per call.",
        f"Workers' `mas` (logged by each worker): {where({p for r in results for p in r.get('worker_mas', [])})}",
        "",
        TABLE_HEAD,
        *[row(r) for r in results],
        "",
        "Ideal wall = plan + write + N renders + grade + review, ideal first = plan + write + render + grade + review, "
        "from the medians below (an agent call at its measured median, a render at ComfyUI's, a grade at the gpu "
        "worker's). Busy fractions are from ComfyUI's own /history timestamps; times to the first accepted video "
        "from the Video rows; calls in flight from the stand-in.",
        "",
        DETAIL_HEAD,
        *[detail_row(r) for r in results],
        "",
        "Tokens are the stand-in's count (words plus punctuation marks); its cached share is a SIMULATED prefix "
        "cache (the longest common prefix with any of the last 64 prompts), what a server with prefix caching "
        "could serve, not a measurement.",
        "",
        "Reading (computed from the figures):",
        "",
        *reading(results),
        "",
    ]
    text = section(args.label, body)
    print("\n" + text)
    if not args.no_write:
        write_section(args.label, text)


# --- the real local model ---------------------------------------------------------------------------
PREFIX_HIT = re.compile(r"Llama\.generate: (\d+) prefix-match hit, remaining (\d+) prompt tokens to eval")
FULL_HIT = "Llama.generate: full prompt already cached"
NO_PARTIAL = re.compile(r"Llama\.generate: (\d+) prefix-match found but partial kv removal not supported")
REQUESTS = re.compile(r'"POST /v1/chat/completions HTTP/1\.1" (\d+)')


def real_llm(args) -> None:
    from bench.harness import command_line, machine, new_data_dir, remove_data_dir
    from tests.llm_server import MODEL_NAME, LocalLLM, unavailable_reason
    from tests.studio import IsolatedStudio

    reason = unavailable_reason()
    if reason:
        raise SystemExit(reason)
    base = new_data_dir("mas-agents-real-llm-")
    videos = args.real_videos
    with LocalLLM(base) as server:
        offset = server.log.stat().st_size
        env = {
            "MAS_AGENT_BACKEND": "llm",
            "MAS_LLM_URL": server.url,
            "MAS_LLM_MODEL": MODEL_NAME,
            "MAS_PREVIEW_RENDER_SECONDS": "0",
            "MAS_LLM_CONTEXT_CHARS": str(args.context_chars),
            "MAS_AGENT_CONVERSATIONS": "1",
            "MAS_LLM_MAX_IN_FLIGHT": "16",
        }
        studio = IsolatedStudio(base / "studio", **env)
        studio.worker_args = ["-I", "bench.agents_bench"]
        try:
            with studio:
                studio.worker("cpu", concurrency=1)
                studio.worker("gpu")
                started = time.monotonic()
                batch_id = studio.enqueue(REQUEST.format(n=videos))
                finished = wait_final(studio, batch_id, args.timeout or 3600)
                wall = time.monotonic() - started
                status = batch_row(studio, batch_id)[0]
                rows = studio.videos(batch_id)
                attempts = sum(v.attempt_count for v in rows)
                states = [v.state.value for v in rows]
                logs = "".join(w.log.read_text(errors="replace") for w in studio.workers)
        finally:
            remove_data_dir(studio.settings, base / "studio")
        with server.log.open("rb") as log:
            log.seek(offset)
            server_log = log.read().decode(errors="replace")
    shutil.rmtree(base, ignore_errors=True)
    calls = worker_calls(logs)
    prompt = sum(int(c[4]) for c in calls)
    completion = sum(int(c[5]) for c in calls)
    hits = [(int(a), int(b)) for a, b in PREFIX_HIT.findall(server_log)]
    cached = sum(a for a, _ in hits)
    full = server_log.count(FULL_HIT)
    requests = REQUESTS.findall(server_log)
    share = cached / prompt if prompt else 0
    print(
        f"calls {len(calls)}, requests {len(requests)}, prompt {prompt}, completion {completion}, cached {cached}, "
        f"hits {len(hits)}, full {full}, workers ran mas from {sorted(set(ANNOUNCED.findall(logs)))}"
    )
    body = [
        f"Machine: {machine()}",
        f"Command: `{command_line(__file__)}`",
        code_line(),
        f'Setup: `mas enqueue "{REQUEST.format(n=videos)}"` on SmolLM2-135M-Instruct (Q4_1 GGUF) on llama.cpp\'s '
        f"server (llama-cpp-python 0.3.36, one slot, its default settings: no prompt-state cache, `verbose` on), "
        f"one cpu worker -c 1, preview renders and grader, MAS_LLM_CONTEXT_CHARS={args.context_chars}.",
        f"Workers' `mas` (logged by each worker): {where(set(ANNOUNCED.findall(logs)))}",
        "",
        "| batch | videos | accepted / failed | attempts | wall s | agent calls (valid) | HTTP requests | "
        "prompt tokens / video | completion tokens / video | prompt tokens from llama.cpp's cache | cached share |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        f"| {status if finished else 'not done'} | {videos} | {states.count('accepted')} / {states.count('failed')} | "
        f"{attempts} | {wall:.0f} | {len(calls)} | {len(requests)} | {prompt / videos:.0f} | "
        f"{completion / videos:.0f} | "
        f"{cached} | {100 * share:.0f} % |",
        "",
        f"Prompt and completion tokens are the server's `usage` as each valid call logged it (corrections included). "
        f"llama.cpp's server reports no cached tokens in `usage` (only prompt_tokens, completion_tokens, "
        f"total_tokens); the cached count is the sum of its log lines `Llama.generate: N prefix-match hit, remaining "
        f"M prompt tokens to eval` ({len(hits)} such lines in {len(requests)} requests; {full} `full prompt already "
        f"cached`, not counted; {len(NO_PARTIAL.findall(server_log))} `prefix-match found but partial kv removal not "
        "supported`). It keeps one KV state, the previous request's: a prefix is reused only when it matches the "
        "call just before.",
        "",
    ]
    text = section(f"{args.label}-real-llm", body)
    print("\n" + text)
    if not args.no_write:
        write_section(f"{args.label}-real-llm", text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delays", default="0.2,2,5", help="LLM call latencies L in seconds, comma-separated")
    parser.add_argument("--procs", default="1,2,4", help="cpu worker processes (-c N), comma-separated")
    parser.add_argument("--videos", type=int, default=12)
    parser.add_argument("--render-seconds", type=float, default=1.0, help="ComfyUI time of one render")
    parser.add_argument(
        "--min-grade",
        default="F",
        help="MAS_MIN_ACCEPTABLE_GRADE (the timed renders are random frames the preview grader grades "
        "low; F accepts each at its first attempt so N videos are N renders; '' for the default)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=0,
        help="seconds a configuration may take (default 180 + videos x (6 L + 10 render seconds))",
    )
    parser.add_argument("--label", default="latest", help="the section of RESULTS-agents.md (e.g. before, after)")
    parser.add_argument("--no-write", action="store_true", help="print the report, do not write it")
    parser.add_argument("--real-llm", action="store_true", help="run the real local model instead of the matrix")
    parser.add_argument("--real-videos", type=int, default=3)
    parser.add_argument("--context-chars", type=int, default=2000, help="MAS_LLM_CONTEXT_CHARS for --real-llm")
    args = parser.parse_args()
    if args.real_llm:
        real_llm(args)
    else:
        matrix(args)


if __name__ == "__main__":
    main()
