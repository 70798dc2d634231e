"""An LLM LATENCY STAND-IN for benchmarks. It is NOT a model: it generates nothing, it understands nothing.

It serves OpenAI's `/v1/chat/completions` and `/v1/models` and answers every call after a set delay
(`--delay L` seconds), with a reply that is valid for the studio's role tasks (the `TASK`, `INPUT`,
`REPLY`, `RULES` lines of `mas.agents.protocol.task_message`), worked out by fixed rules from the INPUT the
way a competent model would answer:

- plan: as many distinct concepts as asked, each drawn from the request's theme;
- write: a vivid prompt naming the brief's concept and applying the user's style from the INPUT;
- review: accept when the grade meets min_grade, else refine with a strategy while attempt < max_retries,
  else fail;
- consolidate: a summary of the activity and one learning;
- read_style: the studio's own reading of the feedback (`mas.agents.style_reader`);
- any other task: an object of its JSON schema's shape.

Every response names its model `not-a-model-latency-standin`, so no recorded figure can be taken for a
model's. The reply format asked for is honoured: `response_format: json_schema` -> the JSON in
`message.content`; `tools` with a forced `tool_choice` -> one call of the tool named, its `arguments` the
JSON; anything else -> the JSON in the content.

`usage` counts tokens as words plus punctuation marks (the regex `\\w+|[^\\w\\s]`), not chars/4.
`prompt_tokens_details.cached_tokens` is a SIMULATION of what a server with prefix caching would serve
from cache: the longest common token prefix between this prompt (all messages rendered in order as one
text) and any of the last 64 prompts it served. Nothing is cached or computed for real.

Calls are served concurrently by asyncio (no thread per call, no limit). Per role (read from the system
prompt: "You are the Director/Writer/Cameraman", "sleeptime" for anything else) it records the most calls
in flight at once and the calls served: `GET /stats` (JSON), `POST /stats/reset`.

    python bench/llm_standin.py --port 8765 --delay 2

or, from a benchmark: `with StandIn(delay=2) as llm: ... llm.url, llm.stats(), llm.reset()`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any

from mas.agents import style_reader
from mas.agents.reading import as_reply

MODEL = "not-a-model-latency-standin"
CACHE_PROMPTS = 64
TOKEN = re.compile(r"\w+|[^\w\s]")
ROLES = {"You are the Director": "director", "You are the Writer": "writer", "You are the Cameraman": "cameraman"}
GRADES = "ABCDEF"

SCENES = [
    "at dawn over a misty mountain lake",
    "in a moonlit forest clearing",
    "above a storm-lit sea",
    "among the ruins of a desert temple",
    "in a glowing crystal cavern",
    "across a frozen tundra at dusk",
    "over a volcanic caldera",
    "in a bamboo grove after rain",
    "on a cliff above a harbour at sunset",
    "in a sunken city under the waves",
    "drifting through autumn mist",
    "beside a waterfall at golden hour",
    "in a field of fireflies at night",
    "over dunes under a blood moon",
    "in a cathedral of giant trees",
    "above a city of lanterns",
    "on a glacier under the aurora",
    "in a flooded jungle ruin",
    "on a salt flat mirroring the sky",
    "in a snowfall over pine forest",
]
CREATURES = [
    "phoenix",
    "dragon",
    "griffin",
    "kraken",
    "unicorn",
    "kitsune",
    "thunderbird",
    "sea serpent",
    "qilin",
    "wyvern",
    "hippogriff",
    "basilisk",
    "roc",
    "selkie",
    "chimera",
    "leviathan",
    "pegasus",
    "manticore",
    "sphinx",
    "wendigo",
]
APPROACHES = [
    "slow dolly-in, shallow depth of field",
    "wide aerial orbit",
    "low-angle handheld tracking",
    "locked-off symmetrical frame",
    "macro detail with rack focus",
    "long lens compression",
]


# --- the answers ----------------------------------------------------------------------------------
def _theme_subjects(theme: str) -> list[str]:
    if re.search(r"myth|creature|beast|legend|fantas", theme, re.I):
        return CREATURES
    return [theme]


def plan(data: dict, count: int) -> dict:
    request = data.get("request") or {}
    theme = str(request.get("theme") or request.get("text") or "the theme").strip()
    kind = request.get("kind", "batch")
    count = count or int(request.get("count") or 1)
    subjects = _theme_subjects(theme)
    if kind == "ab":
        concept = f"a {subjects[0]} {SCENES[0]}" if subjects is CREATURES else f"{theme} {SCENES[0]}"
        videos = [
            {
                "concept": concept,
                "approach": APPROACHES[i % len(APPROACHES)] + ("" if i < len(APPROACHES) else f", variation {i + 1}"),
            }
            for i in range(count)
        ]
    else:
        start = int(data.get("episodes_done") or 0)
        videos = []
        for i in range(start, start + count):
            subject = subjects[i % len(subjects)]
            scene = SCENES[(i + i // len(SCENES)) % len(SCENES)]
            concept = f"a {subject} {scene}" if subjects is CREATURES else f"{theme}, {scene}"
            if i >= len(SCENES) * (1 if subjects is not CREATURES else len(SCENES)):
                concept += f" (take {i + 1})"
            videos.append({"concept": concept, "approach": ""})
    reply: dict[str, Any] = {"videos": videos, "series_style": "", "consistency_rules": [], "series_elements": []}
    if kind == "series":
        reply.update(
            series_style=f"painterly {theme}, warm rim light, steady camera",
            consistency_rules=["same palette in every episode", "the hero stays recognisable"],
            series_elements=[subjects[0], "a recurring lantern"],
        )
    return reply


def _style_words(style: dict, key: str) -> str:
    return str(style.get(key) or "").strip()


OTHER_WORDS = {
    "purple": "violet",
    "blue": "cobalt",
    "red": "crimson",
    "green": "emerald",
    "yellow": "golden",
    "orange": "amber",
    "dark": "shadowy",
    "moody": "brooding",
    "bright": "luminous",
    "cheerful": "joyful",
    "serene": "tranquil",
    "calm": "tranquil",
    "slow": "unhurried",
    "fast": "brisk",
    "mysterious": "enigmatic",
}
"""The style in words of the stand-in's own, as a capable model writes it (never the block's own words)."""


def _in_other_words(text: str) -> str:
    return re.sub(r"[a-z]+", lambda m: OTHER_WORDS.get(m.group(), m.group()), text.lower())


def write_prompt(brief: dict, variant: int = 0) -> dict:
    concept = str(brief.get("concept") or "the scene")
    style = brief.get("user_style") or {}
    series = brief.get("series") or {}
    disliked = {str(d).lower() for d in style.get("DISLIKED_ELEMENTS") or []}
    parts = [concept[:400]]
    if brief.get("approach"):
        parts.append(str(brief["approach"]))
    parts.append(
        ["slow steady camera glide", "steady camera, gentle push-in", "steady camera, slow orbit"][variant % 3]
    )
    colours, moods = _style_words(style, "COLOR_PREFERENCES"), _style_words(style, "MOOD_PREFERENCES")
    colours, moods = _in_other_words(colours), _in_other_words(moods)
    parts.append(f"dominant colours {colours}" if colours else "dominant colours in a rich harmonious palette")
    parts.append(f"{moods} atmosphere" if moods else "atmospheric volumetric light")
    for key in ("THEME_PREFERENCES", "PACING_PREFERENCES"):
        if _style_words(style, key):
            parts.append(_in_other_words(_style_words(style, key)) + (" pacing" if key == "PACING_PREFERENCES" else ""))  # noqa: PERF401
    for key in ("SERIES_STYLE", "series_style", "style"):
        if isinstance(series, dict) and series.get(key):
            parts.append(str(series[key]))
            break
    if brief.get("previous_failures"):
        parts.append("sharp focus, fine detail, smooth slow motion")
    else:
        parts.append("sharp focus, cinematic lighting")
    prompt = ", ".join(p for p in parts if not any(d and d in p.lower() for d in disliked))
    negative = ", ".join(["blur", "noise", "jitter", *sorted(disliked)])
    return {"prompt": prompt[:1400], "negative_prompt": negative[:500]}


def review(data: dict) -> dict:
    grade, least = str(data.get("grade", "F")).upper()[:1], str(data.get("min_grade", "B")).upper()[:1]
    attempt, retries = int(data.get("attempt") or 1), int(data.get("max_retries") or 1)
    scores = data.get("scores") or {}
    weak = [k for k, v in scores.items() if isinstance(v, (int, float)) and k != "total" and v < 0.6]
    if GRADES.find(grade) >= 0 and GRADES.find(grade) <= max(GRADES.find(least), 0):
        return {"action": "accept", "failure_reasons": [], "strategy": ""}
    reasons = [f"weak {k}" for k in weak] or [f"grade {grade} below {least}"]
    if attempt < retries:
        return {
            "action": "refine",
            "failure_reasons": reasons,
            "strategy": "sharper focus, steadier camera and a dominant palette; fix " + ", ".join(reasons),
        }
    return {"action": "fail", "failure_reasons": reasons, "strategy": ""}


def consolidate(data: dict) -> dict:
    activity = [str(a) for a in data.get("activity") or []]
    accepted = sum("accept" in a.lower() for a in activity)
    return {
        "summary": f"{len(activity)} videos finished since the last consolidation, {accepted} accepted.",
        "learnings": ["prompts naming a steady camera, sharp focus and a dominant palette grade best"],
    }


def read_style(data: dict) -> dict:
    """The studio's own reading of the feedback, in the reply's shape."""
    return as_reply(style_reader.read(str(data.get("feedback") or "")))


def from_schema(schema: dict, name: str = "value") -> Any:
    """An instance of a JSON schema's shape, for a task this stand-in has no rule for."""
    kind = schema.get("type")
    if "enum" in schema:
        return schema["enum"][0]
    if kind == "object" or "properties" in schema:
        return {k: from_schema(v, k) for k, v in (schema.get("properties") or {}).items()}
    if kind == "array":
        return [from_schema(schema.get("items") or {}, name) for _ in range(schema.get("minItems", 1))]
    if kind in ("integer", "number"):
        return 0
    if kind == "boolean":
        return False
    return f"{name} (stand-in)"


def task_of(messages: list[dict]) -> tuple[str, dict, str, str]:
    """(task, input, reply shape, rules) of the last task in the user messages."""
    for message in reversed(messages):
        content = _text(message.get("content"))
        if message.get("role") != "user" or "TASK " not in content:
            continue
        lines = content.split("\n")
        start = max(i for i, line in enumerate(lines) if line.startswith("TASK "))
        fields = {"TASK": "", "INPUT": "{}", "REPLY": "", "RULES": ""}
        for line in lines[start:]:
            head, _, rest = line.partition(" ")
            if head in fields and not (head == "TASK" and fields["TASK"]):
                fields[head] = rest
        try:
            data = json.loads(fields["INPUT"])
        except json.JSONDecodeError:
            data = {}
        return fields["TASK"].strip(), data if isinstance(data, dict) else {}, fields["REPLY"], fields["RULES"]
    return "", {}, "", ""


def answer(task: str, data: dict, rules: str, schema: dict | None) -> dict:
    props = (schema or {}).get("properties") or {}
    count = next((props[k].get("minItems") for k in ("videos", "candidates") if k in props), None)
    if count is None:
        found = re.search(r"(?:exactly )?(\d+) (?:videos|distinct candidate)", rules)
        count = int(found.group(1)) if found else None
    if task == "plan":
        return plan(data, count or 0)
    if task == "write":
        brief = data.get("brief") or {}
        if "candidates" in props or "candidate" in rules:
            return {"candidates": [write_prompt(brief, i) for i in range(count or 1)]}
        return write_prompt(brief)
    if task == "review":
        return review(data)
    if task == "consolidate":
        return consolidate(data)
    if task == "read_style":
        return read_style(data)
    return from_schema(schema or {"type": "object", "properties": {}})


# --- the server -----------------------------------------------------------------------------------
def _text(content: Any) -> str:
    if isinstance(content, list):  # content parts
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def role_of(messages: list[dict]) -> str:
    system = next((_text(m.get("content")) for m in messages if m.get("role") == "system"), "")
    return next((role for lead, role in ROLES.items() if lead in system), "sleeptime")


def tokens(text: str) -> list[str]:
    return TOKEN.findall(text)


def rendered(messages: list[dict]) -> str:
    """All messages in order as one text, as a chat template would lay them out."""
    parts = []
    for m in messages:
        calls = json.dumps(m.get("tool_calls")) if m.get("tool_calls") else ""
        parts.append(f"<|{m.get('role', 'user')}|>\n{_text(m.get('content'))}{calls}\n")
    return "".join(parts)


def common_prefix(a: list[str], b: list[str]) -> int:
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:  # the longest k with a[:k] == b[:k], by slices compared in C
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class Stats:
    def __init__(self) -> None:
        self.in_flight: dict[str, int] = {}
        self.reset()

    def reset(self) -> None:
        self.max_in_flight = dict(self.in_flight.items())
        self.calls: dict[str, int] = {}
        self.tasks: dict[str, int] = {}
        self.overall_in_flight = sum(self.in_flight.values())
        self.overall_max = self.overall_in_flight
        self.tokens = {"prompt": 0, "completion": 0, "cached": 0}
        self.since = time.time()

    def enter(self, role: str) -> None:
        self.in_flight[role] = self.in_flight.get(role, 0) + 1
        self.max_in_flight[role] = max(self.max_in_flight.get(role, 0), self.in_flight[role])
        self.overall_in_flight += 1
        self.overall_max = max(self.overall_max, self.overall_in_flight)

    def leave(self, role: str, task: str, usage: dict) -> None:
        self.in_flight[role] -= 1
        self.overall_in_flight -= 1
        self.calls[role] = self.calls.get(role, 0) + 1
        self.tasks[task or "?"] = self.tasks.get(task or "?", 0) + 1
        self.tokens["prompt"] += usage["prompt_tokens"]
        self.tokens["completion"] += usage["completion_tokens"]
        self.tokens["cached"] += usage["prompt_tokens_details"]["cached_tokens"]

    def as_json(self) -> dict:
        roles = sorted(set(self.calls) | set(self.max_in_flight))
        return {
            "model": MODEL,
            "since": self.since,
            "roles": {
                r: {
                    "max_in_flight": self.max_in_flight.get(r, 0),
                    "calls": self.calls.get(r, 0),
                    "in_flight": self.in_flight.get(r, 0),
                }
                for r in roles
            },
            "overall": {
                "max_in_flight": self.overall_max,
                "calls": sum(self.calls.values()),
                "in_flight": self.overall_in_flight,
            },
            "tasks": self.tasks,
            "tokens": self.tokens,
            "token_count": "words plus punctuation marks; cached_tokens is a simulated prefix cache",
        }


def make_app(delay: float):
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    stats = Stats()
    served: deque[list[str]] = deque(maxlen=CACHE_PROMPTS)

    async def completions(request: Request) -> JSONResponse:
        body = await request.json()
        messages = body.get("messages") or []
        role = role_of(messages)
        stats.enter(role)
        task = ""
        try:
            prompt = tokens(rendered(messages))
            cached = max((common_prefix(prompt, p) for p in served), default=0)
            served.append(prompt)
            task, data, _shape, rules = task_of(messages)
            fmt = body.get("response_format") or {}
            schema = (fmt.get("json_schema") or {}).get("schema") or fmt.get("schema")
            tools = body.get("tools") or []
            choice = body.get("tool_choice")
            tool = None
            if tools and choice not in (None, "none", "auto"):
                named = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
                tool = next(
                    (t["function"] for t in tools if t.get("function", {}).get("name") == named),
                    tools[0].get("function", {}),
                )
                schema = schema or tool.get("parameters")
            text = json.dumps(answer(task, data, rules, schema), ensure_ascii=False)
            await asyncio.sleep(delay)
            usage = {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(tokens(text)),
                "total_tokens": len(prompt) + len(tokens(text)),
                "prompt_tokens_details": {"cached_tokens": cached},
            }
            if tool is not None:
                message = {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_" + uuid.uuid4().hex[:12],
                            "type": "function",
                            "function": {"name": tool.get("name", "reply"), "arguments": text},
                        }
                    ],
                }
                finish = "tool_calls"
            else:
                message, finish = {"role": "assistant", "content": text}, "stop"
        except Exception:
            stats.leave(
                role, task, {"prompt_tokens": 0, "completion_tokens": 0, "prompt_tokens_details": {"cached_tokens": 0}}
            )
            raise
        stats.leave(role, task, usage)
        return JSONResponse(
            {
                "id": "chatcmpl-" + uuid.uuid4().hex,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": MODEL,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": usage,
                "system_fingerprint": "latency-standin-not-a-model",
            }
        )

    async def models(_: Request) -> JSONResponse:
        return JSONResponse(
            {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "nobody", "created": 0}]}
        )

    async def get_stats(_: Request) -> JSONResponse:
        return JSONResponse({**stats.as_json(), "delay": delay})

    async def reset_stats(_: Request) -> JSONResponse:
        stats.reset()
        return JSONResponse({**stats.as_json(), "delay": delay})

    return Starlette(
        routes=[
            Route("/v1/chat/completions", completions, methods=["POST"]),
            Route("/chat/completions", completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/stats", get_stats, methods=["GET"]),
            Route("/stats/reset", reset_stats, methods=["POST"]),
        ]
    )


class StandIn:
    """The stand-in in a subprocess on a free loopback port; a context manager."""

    model = MODEL

    def __init__(self, *, delay: float, log: Path | None = None, port: int | None = None) -> None:
        self.delay, self.log = delay, log
        if port is None:
            from tests.ports import free_port  # here: the stand-in's own process runs this file as a script

            port = free_port()
        self.port = port
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> StandIn:
        import httpx

        out = self.log.open("ab") if self.log else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--port", str(self.port), "--delay", str(self.delay)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the LLM stand-in exited ({self.proc.returncode})")
            try:
                if httpx.get(self.url + "/models", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.__exit__()
        raise TimeoutError("the LLM stand-in did not answer within 30 s")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def stats(self) -> dict:
        import httpx

        return httpx.get(f"http://127.0.0.1:{self.port}/stats", timeout=10).json()

    def reset(self) -> dict:
        import httpx

        return httpx.post(f"http://127.0.0.1:{self.port}/stats/reset", timeout=10).json()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--delay", type=float, default=1.0, help="seconds before every answer")
    args = parser.parse_args()
    import uvicorn

    print(
        f"LLM latency stand-in (NOT a model) on http://{args.host}:{args.port}/v1, delay {args.delay:g} s", flush=True
    )
    uvicorn.run(
        make_app(args.delay), host=args.host, port=args.port, log_level="warning", limit_concurrency=None, backlog=2048
    )


if __name__ == "__main__":
    main()
