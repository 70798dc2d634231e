"""The `text/event-stream` format (server-sent events, as the HTML standard defines them), and where a stream
resumes. Pure: no I/O.

A message is `field: value` lines and a blank line: `id:` (what the client sends back as `Last-Event-ID` when
it reconnects), `event:` (the type; a browser's EventSource dispatches it to that type's listeners) and `data:`
(here one line of JSON). A line starting with `:` is a comment (a keep-alive); `retry:` says how many
milliseconds a client waits before it reconnects. A message with an `id:` and no data sets the client's last
event id and dispatches nothing; an event without an `id:` leaves it as it was.
"""

from __future__ import annotations

import json
import re
from typing import Any

from mas.errors import InvalidInput

MAX_ID = 2**63 - 1
"""The largest event id (a bigserial)."""

_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_ESCAPED = {ord(c): f"\\u{ord(c):04x}" for c in "\x85\u2028\u2029"}
"""Characters some line readers (not the standard's) take for line breaks, escaped in JSON's strings, where they
can only occur."""


def _single_line(field: str, value: str) -> str:
    if _LINE_BREAK.search(value) or "\0" in value:
        raise ValueError(f"an event's {field} must be one line without NUL, not {value!r}")
    return value


def event(type: str, data: Any, *, id: int | None = None) -> bytes:
    """One event: its id (None: an event never replayed, which leaves the client's last id alone), its type and
    its data as JSON."""
    lines = [] if id is None else [f"id: {id}"]
    lines.append(f"event: {_single_line('type', type)}")
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str).translate(_ESCAPED)
    lines += [f"data: {line}" for line in _LINE_BREAK.split(text)]  # JSON has no raw line break; kept exact if so
    return ("\n".join(lines) + "\n\n").encode()


def comment(text: str) -> bytes:
    """A comment line: clients ignore it, proxies and the connection see traffic (a keep-alive)."""
    return f": {_single_line('comment', text)}\n\n".encode()


def opening(*, retry_ms: int, last_id: int) -> bytes:
    """A stream's first message: how long to wait before reconnecting, and the id the stream starts after (so a
    client that drops before any event resumes exactly there)."""
    return f"retry: {int(retry_ms)}\nid: {int(last_id)}\n\n".encode()


def resume_point(last_event_id: str | None, after: int | None) -> int | None:
    """Where a stream starts: after the `Last-Event-ID` a reconnecting client sends, else after `?after`; None
    when neither is given (from the newest event on)."""
    if last_event_id is not None and last_event_id.strip():
        given = last_event_id.strip()
        if not given.isascii() or not given.isdigit() or int(given) > MAX_ID:
            raise InvalidInput(
                f"Last-Event-ID {given[:40]!r} is no event id this studio sent (a whole number from 0 to {MAX_ID})"
            )
        return int(given)
    return after
