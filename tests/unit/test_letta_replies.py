"""What Letta's agents send back, read into replies: the JSON object in a model's text, assistant messages and send_message calls, a reply error. Pure code: no server."""

from __future__ import annotations

import json
import pickle
from types import SimpleNamespace

from mas.agents import letta as backend
from mas.agents.letta.replies import reply_candidates
from mas.agents.replies import parse_json_object
from mas.errors import RetryableError


def _response(*messages, stop="end_turn"):
    return SimpleNamespace(messages=list(messages), stop_reason=SimpleNamespace(stop_reason=stop))


def test_parse_json_object_finds_the_object_in_what_models_send():
    assert parse_json_object('{"a": 1}') == {"a": 1}
    assert parse_json_object('```json\n{"a": 1}\n```') == {"a": 1}
    assert parse_json_object('Here you go: {"a": {"b": [1, 2]}} hope it helps') == {"a": {"b": [1, 2]}}
    assert parse_json_object(json.dumps('{"a": 1}')) == {"a": 1}  # double-encoded
    assert parse_json_object("no json at all") is None
    assert parse_json_object("[1, 2]") is None


def test_reply_candidates_read_assistant_messages_and_send_message_calls():
    call = SimpleNamespace(name="send_message", arguments=json.dumps({"message": '{"x": 1}'}), tool_call_id="c")
    other = SimpleNamespace(name="archival_memory_search", arguments="{}", tool_call_id="d")
    response = _response(
        SimpleNamespace(message_type="reasoning_message", reasoning="hmm"),
        SimpleNamespace(message_type="tool_call_message", tool_call=other, tool_calls=[other]),
        SimpleNamespace(message_type="tool_call_message", tool_call=call, tool_calls=[call]),
        SimpleNamespace(
            message_type="assistant_message", content=[SimpleNamespace(text='{"y": '), SimpleNamespace(text="2}")]
        ),
    )
    assert reply_candidates(response) == ['{"x": 1}', '{"y": 2}']
    assert reply_candidates(_response(SimpleNamespace(message_type="assistant_message", content="plain"))) == ["plain"]


def test_reply_error_is_retryable_picklable_and_quotes_the_reply():
    error = backend.LettaReplyError(agent="writer", task="write", problem="no JSON object", excerpt="Sure!")
    assert isinstance(error, RetryableError)
    copy = pickle.loads(pickle.dumps(error))  # Celery ships task exceptions between processes
    assert (copy.agent, copy.task, str(copy)) == ("writer", "write", str(error))
    assert str(error) == "writer answered task 'write' with no JSON object: 'Sure!'"
