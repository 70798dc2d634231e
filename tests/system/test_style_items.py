"""A user's style item by item (`mas.learning.style_book`, `mas style`): every reading shown in sentences with
where it came from, every item correctable (--like, --avoid, forget), the `user_style` block written from the
items, what was not understood quoted with how to say it plainly; and the API's routes over the same items,
each user's own."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from mas.agents.offline import OfflineDirector
from mas.agents.roles import Reading
from mas.agents.style import StyleItem
from mas.cli.root import main
from mas.domain.identity import STUDIO, Actor
from mas.learning import style_book
from mas.memory import blocks


def mas(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def said(settings, actor=STUDIO) -> set[tuple[str, str, str]]:
    return {(e.words, e.polarity, e.source) for e in style_book.entries(settings, actor)}


@pytest.mark.usefixtures("clean")
def test_feedback_is_answered_in_sentences_and_each_item_says_where_it_came_from(clean):
    out = mas("style", "I prefer dark moody aesthetics with purple tones, and no red")
    assert "Read by the studio's rules." in out and "I understood:" in out, out
    assert "  likes: purple (colour)" in out and "  likes: moody (mood)" in out and "  rules out: red (colour)" in out
    assert "user_style" not in out  # sentences, not the block's table

    out = mas("style", "--like", "Film Grain", "--avoid", "handheld camera")
    assert "Stored as you gave it: likes: film grain (other)." in out, out
    assert "Stored as you gave it: rules out: handheld camera (other)." in out, out
    assert said(clean) >= {("purple", "liked", "studio"), ("red", "ruled_out", "studio"),
                           ("film grain", "liked", "user"), ("handheld camera", "ruled_out", "user")}  # fmt: skip

    # the block every prompt is built from says the same
    block = blocks.read(clean, STUDIO, "user_style")
    assert "purple" in block["COLOR_PREFERENCES"] and block["DISLIKED_ELEMENTS"] == ["red", "handheld camera"]
    assert ("film grain", "liked") in {(i["words"], i["polarity"]) for i in block["ITEMS"]}

    listing = mas("style", "show")
    assert "likes: purple (colour): read from feedback by the studio's rules" in listing, listing
    assert '"I prefer dark moody aesthetics with purple tones, and no red"' in listing
    assert "rules out: handheld camera (other): given as is" in listing, listing


@pytest.mark.usefixtures("clean")
def test_a_correction_is_an_item_with_its_history_and_forget_removes_one(clean):
    mas("style", "I love purple and slow pacing")
    out = mas("style", "--avoid", "purple")
    assert "Stored as you gave it: rules out: purple (colour) (it was liked)." in out, out
    (purple,) = [e for e in style_book.entries(clean, STUDIO) if e.words == "purple"]
    assert purple.source == "correction" and not purple.liked
    assert [(h["polarity"], h["source"], h["feedback"]) for h in purple.history] == [
        ("liked", "studio", "I love purple and slow pacing")
    ]
    listing = mas("style", "show")
    assert "rules out: purple (colour): corrected by the user" in listing, listing
    assert 'purple, liked, read from feedback by the studio\'s rules "I love purple and slow pacing"' in listing
    assert blocks.read(clean, STUDIO, "user_style")["DISLIKED_ELEMENTS"] == ["purple"]
    assert blocks.read(clean, STUDIO, "user_style")["ITEM_HISTORY"][-1]["was"] == "liked"

    # turned round again, over the API's flip: the history grows
    turned = style_book.flip(clean, STUDIO, purple.id).entries[0]
    assert turned.liked and [h["polarity"] for h in turned.history] == ["liked", "ruled_out"]

    out = mas("style", "forget", "slow pacing")
    assert "Removed" in out and "no longer likes slow pacing (pacing)" in out, out
    assert {e.words for e in style_book.entries(clean, STUDIO)} == {"purple"}
    assert "slow" not in blocks.read(clean, STUDIO, "user_style")["PACING_PREFERENCES"]
    out = mas("style", "forget", f"#{turned.id}")
    assert style_book.entries(clean, STUDIO) == [] and blocks.read(clean, STUDIO, "user_style")["ITEMS"] == []

    missing = CliRunner().invoke(main, ["style", "forget", "teal"])
    assert missing.exit_code == 2 and "no 'teal'" in missing.output, missing.output


def test_what_the_reader_did_not_understand_is_quoted_kept_and_never_stored(clean, monkeypatch):
    """The reader's "not understood" (filled by the studio's reader and the model's) reaches the user whole."""
    unsure = "the camera should not stop shaking"
    reading = Reading(items=[StyleItem(aspect="colour", words="teal", liked=True)], not_understood=[unsure])
    monkeypatch.setattr(OfflineDirector, "read_style", lambda self, feedback: reading)  # noqa: ARG005
    bob = Actor("bob")
    out = mas("style", "--user", "bob", f"teal, and {unsure}")
    assert "  likes: teal (colour)" in out and f'I did not understand:\n  "{unsure}"' in out, out
    assert 'mas style --user bob --avoid "handheld camera"' in out, out
    assert said(clean, bob) == {("teal", "liked", "studio")}  # nothing of it stored
    assert [i["words"] for i in blocks.read(clean, bob, "user_style")["ITEMS"]] == ["teal"]
    listing = mas("style", "show", "--user", "bob")
    assert f"'{unsure}' in 'teal, and {unsure}'" in listing, listing
    assert "Not understood" not in mas("style", "show")  # bob's, not the default user's


@pytest.mark.usefixtures("clean")
def test_an_item_set_in_the_block_directly_is_taken_in_and_one_removed_there_leaves(clean):
    mas("style", "I love purple")
    blocks.set_field(clean, STUDIO, "user_style", "DISLIKED_ELEMENTS", '["lens flares"]', by="cli")
    assert said(clean) == {("purple", "liked", "studio"), ("lens flares", "ruled_out", "block")}
    blocks.update(clean, STUDIO, "user_style", {"ITEMS": [], "COLOR_PREFERENCES": ""}, by="cli")
    assert said(clean) == {("lens flares", "ruled_out", "block")}


@pytest.mark.usefixtures("clean")
def test_the_style_commands_keep_their_user_and_refuse_bad_items(clean):
    mas("style", "--user", "alice", "--like", "amber light")
    mas("style", "no red", "--user", "alice")
    assert said(clean, Actor("alice")) == {("amber light", "liked", "user"), ("red", "ruled_out", "studio")}
    assert style_book.entries(clean, STUDIO) == []
    assert "default has no style items yet" in mas("style", "show")
    for args, says in ((["--like", "  "], "few words"), (["--avoid", "x" * 200], "at most"),
                       (["--like", "a", "show"], "alone")):  # fmt: skip
        result = CliRunner().invoke(main, ["style", *args])
        assert result.exit_code == 2 and says in result.output, result.output


# --- the API ---------------------------------------------------------------------------------------------


@pytest.fixture
def members(clean):
    """Two members with a key each: alice and bob."""
    from mas.accounts import users

    return {name: {"Authorization": f"Bearer {users.add(clean, name)}"} for name in ("alice", "bob")}


def test_each_member_lists_adds_flips_and_removes_only_their_own_items_over_the_api(clean, members):
    from mas.gallery import create_app

    http = TestClient(create_app(clean), raise_server_exceptions=False)
    alice, bob = members["alice"], members["bob"]
    document = http.get("/api/v1/openapi.json", headers=alice).json()
    assert {"/style/items", "/style/items/{item_id}", "/style/items/{item_id}/flip"} <= set(document["paths"])

    made = http.post("/api/v1/style/items", json={"words": "Handheld Camera", "polarity": "ruled_out"}, headers=alice)
    assert made.status_code == 201, made.text
    item = made.json()
    assert (item["words"], item["polarity"], item["source"]) == ("handheld camera", "ruled_out", "user")
    assert item["says"] == "rules out: handheld camera (other)"
    # the actor is the credential's: a body naming someone else is refused, naming them in the query is forbidden
    named = http.post("/api/v1/style/items", json={"words": "red", "polarity": "liked", "user": "bob"}, headers=alice)
    assert named.status_code == 422, named.text
    assert http.get("/api/v1/style/items?user=bob", headers=alice).status_code == 403
    assert (
        http.post("/api/v1/style/items", json={"words": "x" * 500, "polarity": "liked"}, headers=alice).status_code
        == 422
    )

    # bob sees none of alice's items and cannot touch them: "not found", as an item that does not exist
    assert http.get("/api/v1/style/items", headers=bob).json() == {"user": "bob", "items": [], "not_understood": []}
    for method, path in (("post", f"/style/items/{item['id']}/flip"), ("delete", f"/style/items/{item['id']}"),
                         ("delete", "/style/items/999999999999")):  # fmt: skip
        refused = getattr(http, method)("/api/v1" + path, headers=bob)
        assert refused.status_code == 404, refused.text
    assert said(clean, Actor("alice")) == {("handheld camera", "ruled_out", "user")}

    flipped = http.post(f"/api/v1/style/items/{item['id']}/flip", headers=alice).json()
    assert (flipped["polarity"], flipped["source"]) == ("liked", "correction")
    assert [(h["polarity"], h["source"]) for h in flipped["history"]] == [("ruled_out", "user")]
    assert blocks.read(clean, Actor("alice"), "user_style")["DISLIKED_ELEMENTS"] == []
    listed = http.get("/api/v1/style/items", headers=alice).json()
    assert [i["says"] for i in listed["items"]] == ["likes: handheld camera (other)"]
    removed = http.delete(f"/api/v1/style/items/{item['id']}", headers=alice)
    assert removed.status_code == 200 and removed.json()["words"] == "handheld camera"
    assert http.get("/api/v1/style/items", headers=alice).json()["items"] == []


def test_the_memory_pages_buttons_work_without_scripts_and_only_on_the_callers_items(clean, members):
    from mas.gallery import create_app

    http = TestClient(create_app(clean), raise_server_exceptions=False, follow_redirects=False)
    alice, bob = members["alice"], members["bob"]
    item = style_book.give(clean, Actor("alice"), "lens flares", liked=True).entries[0]
    page = http.get("/memory", headers=alice)
    assert "likes: lens flares (other)" in page.text and f'action="/memory/style/{item.id}/flip"' in page.text
    assert "lens flares" not in http.get("/memory", headers=bob).text
    assert http.post(f"/memory/style/{item.id}/flip", headers=bob).status_code == 404
    assert (
        http.post(f"/memory/style/{item.id}/flip", headers={**alice, "Origin": "http://elsewhere"}).status_code == 403
    )
    done = http.post(f"/memory/style/{item.id}/flip", headers=alice)
    assert done.status_code == 303 and done.headers["location"] == "/memory#style-items"
    assert said(clean, Actor("alice")) == {("lens flares", "ruled_out", "correction")}
    assert http.post(f"/memory/style/{item.id}/forget", headers=alice).status_code == 303
    assert style_book.entries(clean, Actor("alice")) == []


# --- what a batch applies, who wrote each prompt, a model that never answered usably ---------------------


@pytest.mark.usefixtures("workers")
def test_a_batch_states_the_style_it_applies_and_who_wrote_each_prompt(clean):
    import sqlalchemy as sa

    from mas.db import session_scope
    from mas.gallery import create_app
    from mas.models import StudioEvent

    mas("style", "--like", "purple", "--avoid", "red")
    waited = mas("enqueue", "--wait", "Create 1 video of a lighthouse")
    batch_id = int(waited.split()[1].rstrip(":"))
    assert "style applied: likes purple (colour); rules out red (colour)" in waited, waited
    with session_scope(clean) as s:
        planned = s.scalar(sa.select(StudioEvent.payload).where(StudioEvent.type == "batch.planned"))
    assert planned["style"] == {"liked": [{"words": "purple", "aspect": "colour"}],
                                "ruled_out": [{"words": "red", "aspect": "colour"}]}  # fmt: skip
    status = CliRunner().invoke(main, ["status", str(batch_id)], terminal_width=200).output
    assert "style applied: likes purple (colour); rules out red (colour)" in status, status
    assert "prompt by" in status and "the studio" in status, status  # the offline studio writes its own
    assert "warning" not in status  # no model to warn about

    http = TestClient(create_app(clean))
    video_id = http.get(f"/api/v1/batches/{batch_id}").json()["videos"][0]["id"]
    attempt = http.get(f"/api/v1/videos/{video_id}").json()["attempt_history"][0]
    assert (attempt["prompt_source"], attempt["style_check"]) == ("studio", "applied"), attempt
    assert "prompt by the studio&#39;s own" in http.get(f"/batches/{batch_id}").text


@pytest.mark.usefixtures("clean")
def test_a_batch_whose_model_never_gave_a_valid_reply_says_so_naming_the_model_and_endpoint(clean):
    from mas.db import session_scope
    from mas.models import AgentCall, Batch

    with session_scope(clean) as s:
        batch = Batch(request="Create 1 video of owls", theme="owls", total=1)
        s.add(batch)
        s.flush()
        s.add_all(AgentCall(agent="director", task="plan", batch_id=batch.id, tries=3, valid=False, seconds=1.0,
                            prompt_tokens=10, cached_tokens=0, completion_tokens=5) for _ in range(3))  # fmt: skip
    env = {"MAS_AGENT_BACKEND": "llm", "MAS_LLM_MODEL": "prose-only", "MAS_LLM_URL": "http://user:pw@127.0.0.1:9/v1"}
    status = CliRunner().invoke(main, ["status"], env=env, terminal_width=300).output
    assert (
        "warning: the model 'prose-only' at http://" in status and "never gave a valid reply (3 of 3 calls)" in status
    )
    assert "pw@" not in status  # the endpoint's secret is not shown
    assert "warning" not in CliRunner().invoke(main, ["status"], terminal_width=300).output  # offline: no model


def test_readyz_and_services_report_a_model_that_answers_but_is_unusable(clean):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from mas.api.health import Readiness, _agent_replies, _agents
    from mas.db import session_scope
    from mas.models import AgentCall

    class Models(BaseHTTPRequestHandler):  # an endpoint that answers; its replies are another matter
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"data": [{"id": "chatty"}]}')

        def log_message(self, *args) -> None:
            pass

    def calls(valid: bool, n: int) -> None:
        with session_scope(clean) as s:
            s.add_all(AgentCall(agent="writer", task="write", tries=3, valid=valid, seconds=1.0, prompt_tokens=10,
                                cached_tokens=0, completion_tokens=5) for _ in range(n))  # fmt: skip

    endpoint = ThreadingHTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=endpoint.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{endpoint.server_address[1]}/v1"
    try:
        prose = clean.changed(agent_backend="llm", llm_url=url, llm_model="chatty")
        calls(valid=True, n=1)
        calls(valid=False, n=4)
        probes = {"checks": {"agent_endpoint": _agents}, "warnings": {"agent_replies": _agent_replies}}
        assert Readiness(prose, **probes).latest().warnings == {}
        calls(valid=False, n=1)  # five in a row without a valid reply
        latest = Readiness(prose, **probes).latest()
        assert latest.checks == {"agent_endpoint": "ok"}  # it answers, and the studio still takes work
        answer = latest.warnings["agent_replies"]
        env = {"MAS_AGENT_BACKEND": "llm", "MAS_LLM_URL": url, "MAS_LLM_MODEL": "chatty"}
        services = CliRunner().invoke(main, ["services"], env=env, terminal_width=300).output
    finally:
        endpoint.shutdown()
    assert answer == f"answering but unusable: none of the last 5 replies of the model 'chatty' at {url} validated"
    assert f"agents: {answer}" in services, services
