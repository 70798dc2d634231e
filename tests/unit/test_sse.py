"""The `text/event-stream` format the event streams write (`mas.api.sse`), read back the way the HTML standard
tells a browser to parse it, and where a stream resumes."""

from __future__ import annotations

import json
import re

import pytest

from mas.api import sse
from mas.errors import InvalidInput


def parse(stream: bytes) -> list[dict]:
    """The HTML standard's event stream interpretation: each blank line dispatches the fields before it
    (an `id:` alone sets the last id and dispatches nothing); comments are ignored."""
    dispatched, last_id, fields = [], None, {"data": []}
    for line in re.split(r"\r\n|\r|\n", stream.decode()):
        if line == "":
            last_id = fields.get("id", last_id)
            if fields["data"]:
                dispatched.append(
                    {"id": last_id, "event": fields.get("event", "message"), "data": "\n".join(fields["data"])}
                )
            fields = {"data": []}
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data":
                fields["data"].append(value)
            else:
                fields[name] = value
    return dispatched


def test_an_event_has_its_id_type_and_json_data_and_ends_with_a_blank_line():
    body = {"type": "video.state", "data": {"video_id": 3, "from": "writing", "to": "rendering"}}
    raw = sse.event("video.state", body, id=42)
    assert raw == (
        b'id: 42\nevent: video.state\ndata: {"type":"video.state","data":{"video_id":3,"from":"writing",'
        b'"to":"rendering"}}\n\n'
    )
    (parsed,) = parse(raw)
    assert parsed["id"] == "42" and parsed["event"] == "video.state" and json.loads(parsed["data"]) == body


def test_text_with_line_breaks_and_unicode_survives_as_one_data_line():
    body = {"concept": "a kite\nover the dunes\r\nat dusk \u2028\u2029\x85 \u00e9t\u00e9 \U0001f3ae", "none": None}
    raw = sse.event("video.accepted", body, id=1)
    assert raw.count(b"\n") == 4  # id, event, data, blank line: JSON escapes the text's own line breaks
    assert len(raw.decode().splitlines()) == 4  # and those a looser reader splits at (U+2028, NEL)
    assert json.loads(parse(raw)[0]["data"]) == body


def test_an_event_without_an_id_leaves_the_last_id_alone():
    stream = sse.opening(retry_ms=3000, last_id=7) + sse.event("video.progress", {"percent": 30})
    stream += sse.event("batch.done", {}, id=8) + sse.event("video.progress", {"percent": 100})
    parsed = parse(stream)
    assert [(p["event"], p["id"]) for p in parsed] == [
        ("video.progress", "7"),  # the opening set it; the opening itself dispatches nothing
        ("batch.done", "8"),
        ("video.progress", "8"),
    ]
    assert b"id:" not in sse.event("video.progress", {"percent": 30})


def test_the_opening_gives_the_retry_hint_and_a_comment_is_ignored():
    assert sse.opening(retry_ms=3000, last_id=0) == b"retry: 3000\nid: 0\n\n"
    assert sse.comment("keep-alive") == b": keep-alive\n\n"
    assert parse(sse.comment("keep-alive") + sse.opening(retry_ms=1, last_id=5)) == []


@pytest.mark.parametrize("bad", ["two\nlines", "cr\r", "nul\0"])
def test_a_type_or_comment_on_more_than_one_line_is_refused(bad):
    with pytest.raises(ValueError):
        sse.event(bad, {})
    with pytest.raises(ValueError):
        sse.comment(bad)


def test_a_stream_resumes_after_last_event_id_else_after_the_query_else_from_now():
    assert sse.resume_point("41", 7) == 41
    assert sse.resume_point(" 41 ", None) == 41
    assert sse.resume_point(None, 7) == 7
    assert sse.resume_point("", 7) == 7  # an empty id is no id
    assert sse.resume_point(None, None) is None
    assert sse.resume_point(str(sse.MAX_ID), None) == sse.MAX_ID
    for bad in ("-1", "4.5", "forty-two", "\u0661\u0662", str(sse.MAX_ID + 1)):
        with pytest.raises(InvalidInput, match="Last-Event-ID"):
            sse.resume_point(bad, None)
