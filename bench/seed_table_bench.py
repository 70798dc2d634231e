"""The seed's results table (whitepaper v1, 5.1), measured on the studio over its 8 use cases, per agent backend.

One run per backend: the offline rules (the reference), and real models on llama.cpp's server:
SmolLM2-135M-Instruct (the tests' model, `scripts/llm-server-env.sh`) and Gemma 3 270M (a pretrained base
model, `scripts/gemma-model.sh`); and `standin`, `bench/llm_standin.py`, which is NOT A MODEL: it answers each role
task by rules, reads style feedback as the studio's reader does and writes prompts that carry the style in
words of its own (violet for purple, brooding for moody), the way a capable model would. Each run starts its own studio (embedded PostgreSQL and Redis, a cpu and
a gpu worker, the preview renderer and grader) and plays the use cases in order:

1. batch production ("Create 3 videos of mythical creatures"); 2. style learning (`mas style` with the
seed's sentence, then the stored colours, moods and dislikes read back); 3./8. quality refinement and
multi-round refinement (every batch: weak attempts are refined up to MAX_RETRIES); 4. a content series
(2 episodes); 5. an A/B test (2 variations) and a pick; 6. personalization (a batch after the style
was learned: every prompt checked against it); 7. cross-session resume, five times: a batch stopped with work pending (after its plan, a first
prompt, a first render, a first grade, a first video ended), workers and services stopped, the studio
started again and `mas resume`.

The figures come from the studio's own records: batches and videos, each attempt's prompt source and style
check, the agent calls' tries and tokens (`agent_calls`).

    python bench/seed_table_bench.py                         # offline, smollm2, gemma3, standin
    python bench/seed_table_bench.py --backends offline,smollm2 --output /tmp/r.md
"""

from __future__ import annotations

import argparse
import re
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa
from harness import ROOT, command_line, machine, new_data_dir, provenance, remove_data_dir
from llm_standin import StandIn

from mas import db
from mas.agents import studio_rules, style_check
from mas.agents.meaning import StudioMeaning
from mas.agents.style import Style
from mas.config import Settings
from mas.domain.identity import STUDIO
from mas.grades import GRADES
from mas.memory import blocks
from mas.models import AgentCall, Attempt, Batch, BatchStatus, Video, VideoState
from tests.llm_server import GEMMA_MODEL, MODEL_NAME, LocalLLM, unavailable_reason
from tests.llm_server import VERSION as LLM_VERSION
from tests.studio import IsolatedStudio

FEEDBACK = "I prefer dark moody aesthetics with purple and blue tones"
BACKENDS = {
    "offline": None,
    "smollm2": (None, MODEL_NAME),
    "gemma3": (GEMMA_MODEL, "gemma-3-270m"),
    "standin": ("standin", ""),
}
MEANING = StudioMeaning(Settings())
POINTS = {"A": 4.0, "B": 3.0, "C": 2.0, "D": 1.0, "F": 0.0}


def play(studio: IsolatedStudio, timeout: float) -> dict:
    """Use cases 1-6 in one session; returns what the report needs beyond the database."""
    studio.worker("cpu")
    studio.worker("gpu")
    waited = 0.0

    def run(*args: str) -> int:
        nonlocal waited
        result = studio.mas(*args)
        assert result.returncode == 0, result.stdout + result.stderr
        batch_id = int(re.search(r"batch (\d+)", result.stdout).group(1))
        started = time.monotonic()
        studio.wait_until(lambda: _ended(studio, batch_id), timeout=timeout, what=f"batch {batch_id}")
        waited += time.monotonic() - started
        return batch_id

    run("enqueue", "Create 3 videos of mythical creatures")
    learned = studio.mas("style", FEEDBACK)
    stored = blocks.read(studio.settings, STUDIO, "user_style")
    style_at = datetime.now(UTC)
    items = {(i.words, i.liked) for i in Style.of(stored).items}
    style_learned = learned.returncode == 0 and items == {(w, True) for w in ("purple", "blue", "dark", "moody")}
    run("enqueue", "Create 2 videos of dragons")
    run("series", "Mythical Guardians", "--episodes", "2")
    ab_batch = run("ab", "a dragon over a frozen lake", "--variations", "2")
    with db.session_scope(studio.settings) as s:
        test_id = s.get(Batch, ab_batch).ab_test_id
    picked = studio.mas("pick", str(test_id), "A").returncode == 0
    return {"style_learned": style_learned, "style_at": style_at, "stored": stored, "picked": picked, "waited": waited}


STOPS = {
    "after the plan": lambda s, b: _count(s, sa.select(Video.id).where(Video.batch_id == b)) > 0,
    "after a first prompt": lambda s, b: _count(s, _attempts(b)) > 0,
    "after a first render": lambda s, b: _count(s, _attempts(b).where(Attempt.output_path.is_not(None))) > 0,
    "after a first grade": lambda s, b: _count(s, _attempts(b).where(Attempt.grade.is_not(None))) > 0,
    "after a first video ended": lambda s, b: (
        _count(
            s, sa.select(Video.id).where(Video.batch_id == b, Video.state.in_([VideoState.accepted, VideoState.failed]))
        )
        > 0
    ),
}
"""Where use case 7 stops a session: each stop is a batch of its own, left with work pending."""

STOP_TRIES = 3
"""A stop whose batch had already ended when its workers were killed is tried again with a new batch."""


def _attempts(batch_id: int) -> sa.Select:
    return sa.select(Attempt.id).join(Video).where(Video.batch_id == batch_id)


def _count(studio: IsolatedStudio, query: sa.Select) -> int:
    with db.session_scope(studio.settings) as s:
        return len(s.scalars(query).all())


def interrupted(studio: IsolatedStudio, stop: str, timeout: float) -> tuple[int, bool]:
    """Use case 7, first half: a batch whose session ends at `stop`; False when the batch had already ended
    by the time its workers were killed, or never reached the stop within `timeout` (nothing to resume: the
    stop is tried again, and counted as not resumed if it never is)."""
    result = studio.mas("enqueue", "Create 3 videos of sea serpents")
    batch_id = int(re.search(r"batch (\d+)", result.stdout).group(1))
    try:
        studio.wait_until(lambda: STOPS[stop](studio, batch_id), timeout=timeout, what=stop)
    except TimeoutError as late:  # a slow model on a loaded machine: this stop is not measured, the run goes on
        print(f"{stop}: {late}", flush=True)
        for worker in studio.workers:
            worker.kill()
        studio.workers.clear()
        return batch_id, False
    for worker in studio.workers:
        worker.kill()
    studio.workers.clear()
    return batch_id, not _ended(studio, batch_id)


def resumed(studio: IsolatedStudio, batch_id: int, timeout: float) -> tuple[bool, float]:
    """Use case 7, second half: a new session resumes the batch; True when it is then done."""
    studio.worker("cpu")
    studio.worker("gpu")
    started = time.monotonic()
    result = studio.mas("resume", "--yes")
    ended = result.returncode == 0 and f"batch {batch_id}" in result.stdout
    if ended:
        studio.wait_until(lambda: _ended(studio, batch_id), timeout=timeout, what=f"resumed batch {batch_id}")
    with db.session_scope(studio.settings) as s:
        done = ended and s.get(Batch, batch_id).status == BatchStatus.done
    for worker in studio.workers:
        worker.stop()
    studio.workers.clear()
    return done, time.monotonic() - started


def _ended(studio: IsolatedStudio, batch_id: int) -> bool:
    with db.session_scope(studio.settings) as s:
        return s.get(Batch, batch_id).status in (BatchStatus.done, BatchStatus.failed, BatchStatus.cancelled)


def _started(studio: IsolatedStudio, batch_id: int) -> bool:
    with db.session_scope(studio.settings) as s:
        return bool(
            s.scalar(sa.select(sa.func.count()).select_from(Attempt).join(Video).where(Video.batch_id == batch_id))
        )


def measure(name: str, llm_url: str | None, alias: str, timeout: float) -> dict:
    data_dir = new_data_dir(f"mas-seed-{name}-")
    env = {"MAS_PREVIEW_RENDER_SECONDS": "0", "MAS_LLM_CONTEXT_CHARS": "2000"}
    if llm_url is not None:
        env |= {"MAS_AGENT_BACKEND": "llm", "MAS_LLM_URL": llm_url, "MAS_LLM_MODEL": alias}
    wall = time.monotonic()
    studio = IsolatedStudio(data_dir / "studio", **env)
    try:
        with studio:
            facts = play(studio, timeout)
        facts["resumes"] = {}
        for stop in STOPS:  # each stop: a session ends with work pending, a new one resumes it
            for _ in range(STOP_TRIES):
                with IsolatedStudio(data_dir / "studio", **env) as session:
                    session.worker("cpu")
                    session.worker("gpu")
                    pending, left = interrupted(session, stop, timeout)
                if left:
                    break
            if not left:
                facts["resumes"][stop] = None  # the batch always ended before its workers were killed
                continue
            with IsolatedStudio(data_dir / "studio", **env) as again:
                facts["resumes"][stop], resume_wait = resumed(again, pending, timeout)
                facts["waited"] += resume_wait
        with IsolatedStudio(data_dir / "studio", **env) as last:
            report = _figures(last, facts)
    finally:
        remove_data_dir(studio.settings, data_dir)
    report["wall"] = time.monotonic() - wall
    return report


def _figures(studio: IsolatedStudio, facts: dict) -> dict:
    with db.session_scope(studio.settings) as s:
        batches = s.scalars(sa.select(Batch)).all()
        videos = s.scalars(sa.select(Video)).all()
        attempts = s.scalars(sa.select(Attempt)).all()
        calls = s.scalars(sa.select(AgentCall)).all()
        completed = sum(b.status == BatchStatus.done for b in batches)
        states = Counter(v.state for v in videos)
        grades = [v.grade for v in videos if v.grade]
        rendered = [a for a in attempts if a.output_path is not None]
        styled = [a for a in rendered if a.created_at >= facts["style_at"]]
        user_style = Style.of(facts["stored"])
        checks = {a.id: style_check.check(a.prompt, user_style, MEANING) for a in styled}
        reviewed = [a for a in attempts if a.failure_reasons and a.review_source is not None]
        kept = [a for a in reviewed if set(a.failure_reasons) - set(studio_rules.weak_axes(a.scores or {}))]
        never_valid = sum(
            v.state == VideoState.failed and any("valid reply" in r for r in v.failure_reasons or []) for v in videos
        )
        prompt_sources = Counter(a.prompt_source for a in rendered)
        review_sources = Counter(a.review_source or "model" for a in attempts)
        tries = sum(c.tries for c in calls)
        invalid = sum(c.tries - (1 if c.valid else 0) for c in calls)
        tokens = sum(c.prompt_tokens + c.completion_tokens for c in calls)
        examples = [a.prompt for a in sorted(attempts, key=lambda a: a.id) if a.created_at >= facts["style_at"]][:3]
    accepted = states[VideoState.accepted]
    mean = sum(POINTS[g] for g in grades) / max(len(grades), 1)
    return {
        "batches": len(batches),
        "completed": completed,
        "resumes": facts["resumes"],
        "style_learned": facts["style_learned"],
        "stored": facts["stored"],
        "picked": facts["picked"],
        "styled": {source: [checks[a.id] for a in styled if a.prompt_source == source] for source in SOURCES},
        "reviews": len(reviewed),
        "reasons_kept": len(kept),
        "videos": len(videos),
        "accepted": accepted,
        "failed": states[VideoState.failed],
        "never_valid": never_valid,
        "grade_mean": mean,
        "grade_letter": min(GRADES, key=lambda g: abs(POINTS[g] - mean)),
        "grades": Counter(grades),
        "a_rate": sum(g == "A" for g in grades) / max(len(grades), 1),
        "attempts": len(attempts),
        "per_accepted": len(attempts) / max(accepted, 1),
        "seconds_per_video": facts["waited"] / max(len(videos), 1),
        "calls": len(calls),
        "tries": tries,
        "invalid_per_call": invalid / max(len(calls), 1),
        "tokens_per_video": tokens / max(len(videos), 1),
        "prompt_sources": prompt_sources,
        "review_sources": review_sources,
        "examples": examples,
    }


SOURCES = ("model", "repaired", "studio")


def _style(checks: list) -> str:
    """How prompts stand against the style: carried of those read, and how many were not read."""
    read = [c for c in checks if c.checked]
    return f"{_pct(sum(c.applied for c in read), len(read))} / {len(checks) - len(read)}"


def _pct(n: float, d: float) -> str:
    return f"{100 * n / d:.0f} % ({n:g}/{d:g})" if d else "n/a"


def table(results: dict[str, dict]) -> list[str]:
    names = list(results)
    rows = [
        ("Batch completion rate (seed: 100 %)", lambda r: _pct(r["completed"], r["batches"])),
        (
            "Cross-session resume rate (seed: 100 %), sessions stopped at 5 points",
            lambda r: (
                _pct(sum(bool(v) for v in r["resumes"].values()), len(r["resumes"]))
                + "".join(f"; not after {k[6:]}" for k, v in r["resumes"].items() if not v)
            ),
        ),
        ("Style learned from the seed's sentence", lambda r: "yes" if r["style_learned"] else "no"),
        (
            "Prompts that reached the GPU: as the model wrote them / repaired / the studio's own",
            lambda r: " / ".join(_pct(r["prompt_sources"][k], sum(r["prompt_sources"].values())) for k in SOURCES),
        ),
        (
            "Style on the model's own prompts (after `mas style`): carried / not read (language)",
            lambda r: _style(r["styled"]["model"]),
        ),
        ("Style on the repaired prompts: carried / not read", lambda r: _style(r["styled"]["repaired"])),
        ("Style on the studio's own prompts: carried / not read", lambda r: _style(r["styled"]["studio"])),
        (
            "Reviews that refined or failed with the model's own reasons kept beside the grader's",
            lambda r: _pct(r["reasons_kept"], r["reviews"]),
        ),
        ("Average grade (seed: B+)", lambda r: f"{r['grade_letter']} ({r['grade_mean']:.2f} of 4)"),
        ("A rate (seed: 34 % A/A-)", lambda r: f"{100 * r['a_rate']:.0f} %"),
        ("Grades of the videos", lambda r: ", ".join(f"{g} {r['grades'][g]}" for g in GRADES if r["grades"][g])),
        ("Videos accepted / failed", lambda r: f"{r['accepted']} / {r['failed']} of {r['videos']}"),
        ("Videos failed by a reply that never validated", lambda r: str(r["never_valid"])),
        ("Attempts per accepted video", lambda r: f"{r['per_accepted']:.2f} ({r['attempts']} attempts)"),
        ("Seconds per video (agents and pipeline; preview render)", lambda r: f"{r['seconds_per_video']:.1f}"),
        ("Invalid replies per agent call", lambda r: f"{r['invalid_per_call']:.2f} ({r['calls']} calls)"),
        ("Tokens per video", lambda r: f"{r['tokens_per_video']:.0f}"),
        (
            "Reviews whose reply validated / never validated (the studio's rule decides every verdict)",
            lambda r: " / ".join(str(r["review_sources"][k]) for k in ("model", "studio")),
        ),
        ("A/B pick recorded", lambda r: "yes" if r["picked"] else "no"),
        ("Wall of the run, s", lambda r: f"{r['wall']:.0f}"),
    ]
    out = ["| metric | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    out += [f"| {label} | " + " | ".join(f(results[n]) for n in names) + " |" for label, f in rows]
    return out


def printed_results(text: str) -> dict[str, dict]:
    """The results a run printed, one `name {...}` line per backend (a run cut off keeps those it finished)."""
    names = {"Counter": Counter, "StyleCheck": style_check.StyleCheck}
    return {
        line.split(" ", 1)[0]: eval(line.split(" ", 1)[1], names)
        for line in text.splitlines()
        if line.split(" ", 1)[0] in BACKENDS and line.split(" ", 1)[-1].startswith("{")
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="offline,smollm2,gemma3,standin")
    parser.add_argument("--timeout", type=float, default=1800, help="Seconds one batch may take.")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "RESULTS-seed-table.md")
    parser.add_argument(
        "--report-from",
        type=Path,
        nargs="+",
        help="write the report from the result lines earlier runs printed (one backend per line), running nothing",
    )
    args = parser.parse_args()
    results: dict[str, dict] = {}
    for log in args.report_from or []:
        results |= printed_results(log.read_text())
    for name in [] if args.report_from else args.backends.split(","):
        if BACKENDS[name] is None:
            results[name] = measure(name, None, "", args.timeout)
        elif name == "standin":
            with StandIn(delay=0) as standin:
                results[name] = measure(name, standin.url, standin.model, args.timeout)
        else:
            model, alias = BACKENDS[name]
            if unavailable_reason() or (model is not None and not model.exists()):
                raise SystemExit(f"{name}: {unavailable_reason() or 'run: bash scripts/gemma-model.sh'}")
            log_dir = new_data_dir(f"mas-seed-llm-{name}-")
            with LocalLLM(log_dir, model=model, alias=alias) as server:
                results[name] = measure(name, server.url, server.alias, args.timeout)
        print(name, results[name], flush=True)
    lines = [
        "# The seed's results table, measured",
        "",
        f"Machine: {machine()}",
        f"Command: `{command_line(__file__)}`"
        + (" (the results of the runs whose printed lines it read)" if args.report_from else ""),
        provenance({"llama-cpp-python": LLM_VERSION}),
        "",
        *table(results),
        "",
        "Stored style after `mas style` with the seed's sentence:",
        "",
        *[
            f"- {n}: " + ", ".join(f"{i['words']} ({i['polarity']}, {i['aspect']})" for i in r["stored"]["ITEMS"])
            for n, r in results.items()
        ],
        "",
        "First prompts written after the style was learned:",
        "",
        *[f"- {n}: {p!r}" for n, r in results.items() for p in r["examples"]],
        "",
    ]
    args.output.write_text("\n".join(lines))
    print(args.output.read_text())


if __name__ == "__main__":
    main()
