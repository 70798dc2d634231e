"""A STAND-IN for the LLM behind the Letta server in the tests. It is not a model and reasons about nothing.

No LLM runs offline, so the Letta server the tests start (`tests/system/test_letta.py`) is pointed
(OPENAI_BASE_URL) at this small OpenAI-compatible endpoint instead. It answers deterministically:

- GET  /v1/models: one chat model, `gpt-4o-mini` (Letta lists it as `openai-proxy/gpt-4o-mini`);
- POST /v1/embeddings: a unit vector per input derived from a hash of the text (base64 or floats);
- POST /v1/chat/completions, recognised by the tools offered:
  - a primary agent (offered `send_message`): reads the `TASK` / `INPUT` lines of the newest user
    message, computes the reply with the OFFLINE backend's rules (`mas.agents.offline`), and answers with
    a `send_message` tool call whose message is that JSON (or plain content when no such tool is offered);
  - a sleeptime agent (offered `memory_rethink` / `memory_finish_edits`): first rewrites the
    `session_state` block shown in its system prompt, as valid JSON with LAST_ACTIVITY set to now
    (`memory_rethink`), then calls `memory_finish_edits`;
  - no tools (Letta summarizing evicted messages for a compaction): a short plain-text summary.

Knobs for failure tests: `garbage_replies` (the next N task replies are prose, not JSON) and
`fail_summaries` (summary requests answer HTTP 500). `calls` records what was asked, for assertions.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import struct
import threading
import time
from dataclasses import asdict
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from mas.agents.offline import (
    OfflineCameraman,
    OfflineConsolidator,
    OfflineDirector,
    OfflineWriter,
)
from mas.agents.reading import as_reply
from mas.agents.roles import ReviewBrief, WriterBrief
from mas.domain.requests import ProductionRequest

MODEL = "gpt-4o-mini"
EMBEDDING_DIM = 1536
GARBAGE = "Sure! I have thought about it and I think the video should be lovely."


def answer_task(task: str, payload: dict[str, Any]) -> dict[str, Any]:
    """What the stand-in 'decides' for one role task: the offline backend's rules, as JSON."""
    if task == "plan":
        plan = OfflineDirector().plan(ProductionRequest(**payload["request"]), episodes_done=payload.get("episodes_done", 0))
        return asdict(plan)
    if task == "read_style":
        return as_reply(OfflineDirector().read_style(payload["feedback"]).items)
    if task == "write":
        draft = OfflineWriter().write(WriterBrief(**payload["brief"]))
        return {"prompt": draft.prompt, "negative_prompt": draft.negative_prompt}
    if task == "review":
        return asdict(OfflineCameraman().review(ReviewBrief(**payload)))
    if task == "consolidate":
        return asdict(OfflineConsolidator().consolidate(
            activity=payload["activity"], conversations=payload.get("conversations", [])
        ))
    return {"error": f"unknown task {task!r}"}


def parse_task(text: str) -> tuple[str, dict[str, Any]] | None:
    """The TASK name and INPUT object of a role message, or None."""
    task = re.search(r"^TASK (\S+)$", text, re.MULTILINE)
    given = re.search(r"^INPUT (.*)$", text, re.MULTILINE)
    if not task or not given:
        return None
    return task.group(1), json.loads(given.group(1))


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def _block_value(system: str, label: str) -> str | None:
    match = re.search(rf"<{re.escape(label)}>.*?<value>\n(.*?)\n</value>", system, re.DOTALL)
    if not match:
        return None
    # Letta may number the lines of a block it shows; strip "1→ " style prefixes if present
    return "\n".join(re.sub(r"^\s*\d+→\s?", "", line) for line in match.group(1).splitlines())


class StandInLLM:
    """The endpoint, served from a thread of the test process on a free loopback port."""

    def __init__(self) -> None:
        self.garbage_replies = 0
        self.fail_summaries = False
        self.calls: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="stand-in-llm", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> StandInLLM:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def count(self, kind: str, **match: Any) -> int:
        return len(self.find(kind, **match))

    def find(self, kind: str, **match: Any) -> list[dict[str, Any]]:
        with self._lock:
            return [c for c in self.calls if c["kind"] == kind and all(c.get(k) == v for k, v in match.items())]

    # --- the answers -------------------------------------------------------------------------------

    def _record(self, **call: Any) -> None:
        with self._lock:
            self.calls.append({"at": time.time(), **call})

    def chat(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        tools = [t["function"]["name"] for t in body.get("tools") or []]
        messages = body.get("messages") or []
        system = _text(messages[0].get("content")) if messages and messages[0].get("role") == "system" else ""
        if not tools:
            self._record(kind="summary")
            if self.fail_summaries:
                return 500, {"error": {"message": "stand-in LLM told to fail summaries", "type": "server_error"}}
            return 200, self._completion(content=f"Summary (stand-in): {len(messages) - 1} messages reviewed.")
        if "memory_finish_edits" in tools:
            return 200, self._sleeptime(messages, system, tools)
        return 200, self._primary(messages, system, tools)

    def _primary(self, messages: list[dict], system: str, tools: list[str]) -> dict[str, Any]:
        last_user = next((m for m in reversed(messages) if m.get("role") == "user"), None)
        parsed = parse_task(_text(last_user.get("content"))) if last_user else None
        if parsed is None:
            self._record(kind="role", task=None)
            reply = json.dumps({"error": "no TASK in the message"})
        else:
            task, payload = parsed
            with self._lock:
                garbage = self.garbage_replies > 0
                self.garbage_replies -= garbage
            # the user_style block the agent's core memory showed it: whose taste the call saw
            self._record(kind="role", task=task, garbage=garbage, user_style=_block_value(system, "user_style"))
            reply = GARBAGE if garbage else json.dumps(answer_task(task, payload))
        if "send_message" in tools:
            return self._completion(tool=("send_message", {"message": reply}))
        return self._completion(content=reply)

    def _sleeptime(self, messages: list[dict], system: str, tools: list[str]) -> dict[str, Any]:
        # the edit is done once a tool result follows the newest user message (the transcript to review)
        newest_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
        already_edited = any(m.get("role") == "tool" for m in messages[newest_user + 1:])
        seen = len(messages)  # what this run sees: with autoclear, its system prompt and the transcript only
        current = _block_value(system, "session_state")
        if already_edited or current is None or "memory_rethink" not in tools:
            self._record(kind="sleeptime", step="finish", messages=seen)
            return self._completion(tool=("memory_finish_edits", {}))
        try:
            value = json.loads(current)
        except json.JSONDecodeError:
            self._record(kind="sleeptime", step="finish", messages=seen, invalid_json=True)
            return self._completion(tool=("memory_finish_edits", {}))
        value["LAST_ACTIVITY"] = datetime.now(UTC).isoformat(timespec="seconds")
        self._record(kind="sleeptime", step="rethink", messages=seen)
        return self._completion(tool=("memory_rethink", {"label": "session_state", "new_memory": json.dumps(value)}))

    def _completion(self, *, content: str | None = None, tool: tuple[str, dict] | None = None) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if tool is not None:
            name, arguments = tool
            call_id = "call_" + hashlib.sha1(f"{time.time_ns()}{name}".encode()).hexdigest()[:12]
            message["tool_calls"] = [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
            ]
        return {
            "id": "chatcmpl-stand-in", "object": "chat.completion", "created": int(time.time()), "model": MODEL,
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool else "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }

    @staticmethod
    def embeddings(body: dict[str, Any]) -> dict[str, Any]:
        inputs = body.get("input")
        inputs = [inputs] if isinstance(inputs, (str, int)) or (isinstance(inputs, list) and inputs and isinstance(inputs[0], int)) else inputs
        dim = int(body.get("dimensions") or EMBEDDING_DIM)
        data = []
        for i, text in enumerate(inputs or []):
            vector = _vector(json.dumps(text), dim)
            if body.get("encoding_format") == "base64":
                encoded: Any = base64.b64encode(struct.pack(f"<{dim}f", *vector)).decode()
            else:
                encoded = vector
            data.append({"object": "embedding", "index": i, "embedding": encoded})
        return {"object": "list", "data": data, "model": body.get("model"), "usage": {"prompt_tokens": 1, "total_tokens": 1}}

    # --- HTTP --------------------------------------------------------------------------------------

    def _handler(self):
        llm = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, completion: dict[str, Any]) -> None:
                choice = completion["choices"][0]
                delta = {k: v for k, v in choice["message"].items() if v is not None}
                for call_index, call in enumerate(delta.get("tool_calls", [])):
                    call["index"] = call_index
                chunks = [
                    {**completion, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
                    {**completion, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]},
                ]
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for chunk in chunks:
                    chunk.pop("usage", None)
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
                self.close_connection = True

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, {"object": "list", "data": [
                        {"id": MODEL, "object": "model", "created": 0, "owned_by": "stand-in", "context_length": 128000},
                    ]})
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if self.path.endswith("/embeddings"):
                    self._send(200, llm.embeddings(body))
                elif self.path.endswith("/chat/completions"):
                    code, answer = llm.chat(body)
                    if code == 200 and body.get("stream"):
                        self._stream(answer)
                    else:
                        self._send(code, answer)
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

        return Handler


def _vector(text: str, dim: int) -> list[float]:
    """A deterministic unit vector for `text` (same text, same vector)."""
    raw = b""
    counter = 0
    while len(raw) < dim:
        raw += hashlib.sha256(f"{counter}:{text}".encode()).digest()
        counter += 1
    values = [(b - 127.5) / 127.5 for b in raw[:dim]]
    norm = sum(v * v for v in values) ** 0.5 or 1.0
    return [v / norm for v in values]
