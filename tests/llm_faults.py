"""A FAULT-INJECTING STAND-IN for an OpenAI-compatible chat endpoint. It is not a model.

The llm backend's failure tests need replies a real model gives only sometimes: prose, broken JSON,
valid JSON of the wrong shape, a reply that never comes. This endpoint answers each chat request with the
next scripted reply (the last one repeats) and records every request it got, so a test can check what the
studio sent back to the model (the validation error) and that nothing else was asked.
A script entry is text to send as the assistant message, a function of the request's body giving that
text, or HANG (never answer). With `gate`, every request waits until the test opens it; `in_flight` and
`most_in_flight` count requests being answered at once, `wait_in_flight(n)` waits until n are.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HANG = object()


class FaultyLLM:
    def __init__(self, script: list, *, gate: threading.Event | None = None) -> None:
        self.script = list(script)
        self.gate = gate
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.in_flight = self.most_in_flight = 0
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        handler = self._handler()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def _next(self, body: dict, headers: dict):
        with self._lock:
            self.requests.append(body)
            self.headers.append(headers)
            entry = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        return entry(body) if callable(entry) else entry

    def _arrived(self, change: int) -> None:
        with self._changed:
            self.in_flight += change
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self._changed.notify_all()

    def wait_in_flight(self, n: int, *, timeout: float = 60) -> None:
        """Wait until `n` requests are being answered at once."""
        with self._changed:
            if not self._changed.wait_for(lambda: self.in_flight == n, timeout):
                raise AssertionError(f"{self.in_flight} requests in flight after {timeout} s, not {n}")

    def _handler(self):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                outer._arrived(+1)
                try:
                    if outer.gate is not None:
                        outer.gate.wait(120)
                    answer = outer._next(body, dict(self.headers))
                finally:
                    outer._arrived(-1)
                if answer is HANG:
                    time.sleep(3600)
                    return
                payload = json.dumps({
                    "id": "stand-in", "object": "chat.completion", "created": int(time.time()), "model": body.get("model"),
                    "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": answer}}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
                              "prompt_tokens_details": {"cached_tokens": 4}},
                }).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        return Handler

    def __enter__(self) -> FaultyLLM:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
