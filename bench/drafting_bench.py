"""Does one Writer call that drafts several videos' prompts beat one call per video? Measured on the real
local model before adopting it.

The Writer on llama.cpp's server with SmolLM2-135M-Instruct (`tests/llm_server.py`), through the studio's own
llm agent (`mas.agents.llm.LLMAgent`, with its memory in a fresh embedded PostgreSQL): for N briefs (default 3
concepts), (a) N `write` calls, one per brief, as the pipeline makes them, and (b) one call whose INPUT holds
the N briefs and whose reply lists N prompts in order. Per way and round: seconds, prompt and completion tokens
(the server's `usage`), valid replies, and how many prompts name their own concept (a crude check that a
combined reply did not mix the briefs up). Two rounds, so the second sees what the first left in the server's
prompt cache.

    python bench/drafting_bench.py              # writes its section of bench/RESULTS-agents.md
    python bench/drafting_bench.py --no-write
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _path in (str(ROOT), str(ROOT / "bench")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

CONCEPTS = ("a red fox in fresh snow at dawn", "a lighthouse in a winter storm", "a koi pond under cherry blossom")
STYLE = {"COLOR_PREFERENCES": "purple, blue", "MOOD_PREFERENCES": "moody", "DISLIKED_ELEMENTS": ["cheerful"]}


def _brief(concept: str) -> dict:
    from mas.agents.roles import WriterBrief

    brief = WriterBrief(
        concept=concept,
        attempt=1,
        user_style=STYLE,
        series={},
        winning_patterns=["slow dolly-in"],
        failure_patterns=["jittery, unstable motion"],
        past_successes=[],
    )
    return {k: v for k, v in asdict(brief).items() if k != "video_id"}


def _names_its_concept(prompt: str, concept: str) -> bool:
    words = [w for w in concept.split() if len(w) > 3 and w not in ("fresh", "under", "winter")]
    return any(w in prompt.lower() for w in words)


def measure(settings, concepts: tuple[str, ...]) -> dict:
    from mas.agents.asking import WRITE_RULES
    from mas.agents.llm import LLMAgent, LLMReplyError
    from mas.agents.protocol import Question
    from mas.agents.replies import CandidatesReply, DraftReply
    from mas.domain.identity import STUDIO

    rows = {}
    agent = LLMAgent(settings, STUDIO, "writer")
    one = {"seconds": 0.0, "prompt": 0, "completion": 0, "valid": 0, "named": 0}
    for concept in concepts:
        question = Question(
            task="write",
            payload={"brief": _brief(concept)},
            shape='{"prompt": str, "negative_prompt": str}',
            reply=DraftReply,
            rules=WRITE_RULES,
        )
        started = time.monotonic()
        try:
            reply = agent.ask(question)
            one["valid"] += 1
            one["named"] += _names_its_concept(reply.prompt, concept)
        except LLMReplyError:
            pass
        one["seconds"] += time.monotonic() - started
        if agent.last is not None:
            one["prompt"] += agent.last.prompt_tokens
            one["completion"] += agent.last.completion_tokens
    rows["one call per video"] = one
    together = {"seconds": 0.0, "prompt": 0, "completion": 0, "valid": 0, "named": 0}
    question = Question(
        task="write",
        payload={"briefs": [_brief(c) for c in concepts]},
        shape='{"candidates": [{"prompt": str, "negative_prompt": str}]}',
        reply=CandidatesReply,
        context={"count": len(concepts)},
        rules=f"one prompt per brief, in the order of the briefs ({len(concepts)} in all); " + WRITE_RULES,
    )
    started = time.monotonic()
    try:
        reply = agent.ask(question)
        together["valid"] = len(reply.candidates)
        together["named"] = sum(_names_its_concept(c.prompt, k) for c, k in zip(reply.candidates, concepts, strict=True))
    except LLMReplyError:
        pass
    together["seconds"] = time.monotonic() - started
    if agent.last is not None:
        together["prompt"], together["completion"] = agent.last.prompt_tokens, agent.last.completion_tokens
    rows["one call for all"] = together
    return rows


def main() -> None:
    from agents_bench import code_line, section, write_section
    from harness import command_line, machine, new_data_dir, remove_data_dir

    from tests.llm_server import MODEL_NAME, LocalLLM, unavailable_reason
    from tests.studio import IsolatedStudio

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason:
        raise SystemExit(reason)
    base = new_data_dir("mas-drafting-")
    results = []
    with LocalLLM(base) as server:
        studio = IsolatedStudio(base / "studio")
        try:
            with studio:
                settings = studio.settings.model_copy(
                    update={"agent_backend": "llm", "llm_url": server.url, "llm_model": MODEL_NAME,
                            "llm_context_chars": 2000, "llm_timeout_seconds": 300}
                )
                for n in range(1, args.rounds + 1):
                    for way, row in measure(settings, CONCEPTS).items():
                        results.append((n, way, row))
                        print(n, way, row, flush=True)
        finally:
            remove_data_dir(studio.settings, base / "studio")
    count = len(CONCEPTS)
    body = [
        f"Machine: {machine()}",
        f"Command: `{command_line(__file__)}`",
        code_line(),
        f"Setup: the Writer (the studio's llm agent, its memory in PostgreSQL) on SmolLM2-135M-Instruct on llama.cpp's "
        f"server; {count} briefs (one concept each, the same style); per round first one call per brief, then one "
        "call for all of them.",
        "",
        "| round | way | seconds | prompt tokens | completion tokens | valid prompts | prompts naming their concept |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *(
            f"| {n} | {way} | {r['seconds']:.1f} | {r['prompt']} | {r['completion']} | {r['valid']} / {count} | "
            f"{r['named']} / {count} |"
            for n, way, r in results
        ),
        "",
    ]
    text = section("drafting-real-llm", body)
    print("\n" + text)
    if not args.no_write:
        write_section("drafting-real-llm", text)


if __name__ == "__main__":
    main()
