"""Bad input, as a careless or hostile user gives it: the real `mas` command in subprocesses and the gallery
over HTTP (`mas serve`), against real PostgreSQL and Redis. For every case: the exit status (2 for bad
usage, 1 for a studio error), a one-line message and no traceback, and nothing changed: the same rows in
every table, the same block versions, the same messages in every queue.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from mas import db
from mas.errors import InvalidInput
from mas.memory.archival import ArchivalMemory
from mas.runtime.clients import redis_client
from tests.ports import free_port
from tests.studio import ROOT, IsolatedStudio


@pytest.fixture(scope="module")
def studio():
    with tempfile.TemporaryDirectory(prefix="mas-bad-input-") as tmp:
        Path(tmp).chmod(0o755)  # as root, the embedded PostgreSQL runs as another user that must enter it
        with IsolatedStudio(Path(tmp) / "studio") as studio:
            yield studio


def snapshot(studio: IsolatedStudio) -> dict:
    """Everything a command could have written: row counts, block versions, queued messages."""
    from mas.runtime.app import Studio, queue_keys  # not at import: the app would read the settings too early

    with db.session_scope(studio.settings) as s:
        tables = s.execute(sa.text(
            "select tablename from pg_tables where schemaname='public' and tablename<>'alembic_version'"
        )).scalars().all()
        counts = {t: s.execute(sa.text(f'select count(*) from "{t}"')).scalar_one() for t in tables}
        versions = dict(s.execute(sa.text("select label, version from memory_blocks")).all())
    app = Studio(studio.settings)
    client = redis_client(studio.settings)
    queues = {q.name: sum(client.llen(k) for k in queue_keys(app, q.name)) for q in app.conf.task_queues}
    return {"rows": counts, "blocks": versions, "queues": queues}


def run(studio: IsolatedStudio, *args: str | bytes, env: dict | None = None, cwd: Path | None = None):
    argv = [sys.executable, "-m", "mas.cli", *args]
    return subprocess.run(argv, env={**studio.env, **(env or {})}, cwd=cwd or ROOT, capture_output=True, timeout=120)


def refused(studio: IsolatedStudio, *args: str | bytes, status: int, says: str, env: dict | None = None,
            cwd: Path | None = None) -> str:
    """Run a command that must be refused; check its status, its one error line and that nothing changed."""
    before = snapshot(studio)
    result = run(studio, *args, env=env, cwd=cwd)
    out = (result.stdout + result.stderr).decode(errors="replace")
    assert result.returncode == status, out
    assert "Traceback" not in out, out
    errors = [line for line in result.stderr.decode(errors="replace").splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and says.lower() in errors[0].lower(), out
    assert snapshot(studio) == before, out
    return out


CASES = [
    # ids beyond PostgreSQL's integer, negative and zero limits: bad usage, refused by the parser
    (("status", "9" * 40), 2, "is not in the range"),
    (("cancel", "3000000000"), 2, "is not in the range"),
    (("cancel", "1", "--video", "-5"), 2, "is not in the range"),
    (("pick", "99999999999", "A"), 2, "is not in the range"),
    (("videos", "--limit", "-1"), 2, "is not in the range"),
    (("memory", "history", "user_style", "--limit", "0"), 2, "is not in the range"),
    (("grade", "0"), 2, "is not in the range"),
    (("schedule", "cancel", "--", "-1"), 2, "is not in the range"),
    # requests misread before: now refused with the reason
    (("ab", "a fox", "--variations", "27"), 2, "is not in the range"),
    (("enqueue", 'Generate 27 variations of "a fox"'), 2, "at most 26 variations"),
    (("enqueue", "Create -3 videos of foxes"), 2, "at least 1"),
    (("enqueue", ""), 2, "empty"),
    (("enqueue", "x" * 5000), 2, "characters long"),
    (("enqueue", "--priority", "urgent", "Create a video of a fox"), 2, "invalid value"),
    # block values: JSON strings the database refuses, structured entries without their fields
    (("memory", "set", "user_style", "COLOR_PREFERENCES", '"red\\u0000blue"'), 2, "NUL"),
    (("memory", "set", "user_style", "COLOR_PREFERENCES", '"\\ud800"'), 2, "lone surrogate (U+D800)"),
    (("memory", "set", "user_style", "COLOR_PREFERENCES", '["\\udcff"]'), 2, "not a valid Unicode character"),
    (("memory", "set", "session_state", "PENDING_WORK", '[{"request": "x"}]'), 2, "PENDING_WORK.0.batch_id"),
    (("memory", "set", "ab_testing", "VARIATIONS", '[{"label": "A"}]'), 2, "VARIATIONS.0"),
    (("memory", "set", "ab_testing", "USER_SELECTIONS", '["B"]'), 2, "USER_SELECTIONS.0"),
    (("memory", "set", "quality_standards", "MAX_RETRIES", "500"), 2, "less than or equal to 20"),
    (("memory", "set", "nonsense", "X", "1"), 2, "unknown memory block"),
    (("memory", "set", "user_style", "NOPE", "1"), 2, "has no field"),
    # ports a socket cannot have
    (("serve", "--port", "99999"), 2, "is not in the range"),
    (("serve", "--port", "-1"), 2, "is not in the range"),
    (("flower", "--port", "65536"), 2, "is not in the range"),
]


@pytest.mark.parametrize(("args", "status", "says"), CASES, ids=[" ".join(c[0])[:40] for c in CASES])
def test_bad_arguments_are_refused_and_change_nothing(studio, args, status, says):
    refused(studio, *args, status=status, says=says)


SETTINGS = [
    ({"MAS_COMFYUI_NODES": "{not json"}, "invalid MAS_COMFYUI_NODES"),
    ({"MAS_COMFYUI_NODES": '["prompt"]'}, "invalid MAS_COMFYUI_NODES"),
    ({"MAS_DQA_WEIGHTS": "[0.25, 0.15"}, "invalid MAS_DQA_WEIGHTS"),
    ({"MAS_COMFYUI_URL": "http://127.0.0.1:99999"}, "MAS_COMFYUI_URL"),
    ({"MAS_CPU_CONCURRENCY": "100000"}, "MAS_CPU_CONCURRENCY"),
    ({"MAS_VIDEO_FPS": "1e23"}, "MAS_VIDEO_FPS"),
    ({"MAS_MAX_RETRIES": "50"}, "MAS_MAX_RETRIES"),
    ({"MAS_GPU_LOOKAHEAD": "-1"}, "MAS_GPU_LOOKAHEAD"),
    ({"MAS_VISIBILITY_TIMEOUT_SECONDS": "100"}, "MAS_VISIBILITY_TIMEOUT_SECONDS"),
    ({"MAS_GPU_DEVICE": "the big one"}, "MAS_GPU_DEVICE"),
    ({"MAS_LLM_URL": "ftp://example"}, "MAS_LLM_URL"),
]


@pytest.mark.parametrize(("env", "says"), SETTINGS, ids=[next(iter(e)) for e, _ in SETTINGS])
def test_settings_that_cannot_work_are_refused_at_start_by_name(studio, env, says):
    refused(studio, "enqueue", "Create a video of a fox", status=1, says=says, env=env)


def test_a_data_folder_that_is_empty_or_cannot_be_created_is_refused(studio):
    refused(studio, "status", status=1, says="MAS_DATA_DIR", env={"MAS_DATA_DIR": ""})
    refused(studio, "status", status=1, says="cannot be used", env={"MAS_DATA_DIR": "/proc/mas-data"})


def test_bytes_that_are_not_utf8_in_arguments_and_in_the_env_file(studio, tmp_path):
    refused(studio, "enqueue", b"Create 2 videos of caf\xe9s", status=2, says="not valid UTF-8")
    refused(studio, "style", b"I like \xff\xfe tones", status=2, says="not valid UTF-8")
    refused(studio, "memory", "search", b"\xff\xfe cats", status=2, says="not valid UTF-8 text (byte 0xff")
    refused(studio, "memory", "set", "user_style", "COLOR_PREFERENCES", b"caf\xe9", status=2, says="not valid UTF-8")
    (tmp_path / ".env").write_bytes(b"MAS_SLEEPTIME_FREQUENCY=5\nMAS_LLM_MODEL=caf\xe9\n")
    refused(studio, "status", status=1, says="not UTF-8", cwd=tmp_path)


def test_an_unreachable_result_backend_refuses_the_request_before_anything_is_stored(studio):
    refused(studio, "enqueue", "Create a video of a fox", status=1, says="does not answer",
            env={"MAS_RESULT_BACKEND": "redis://127.0.0.1:9/0"})


def test_user_text_is_printed_as_text_never_as_markup_or_terminal_codes(studio):
    request = "Create 2 videos of [bold]dragons[/bold] in [red] \x1b[2Jfog\x07"
    result = run(studio, "enqueue", request)
    out = result.stdout.decode()
    assert result.returncode == 0, result.stderr.decode()
    assert "[bold]dragons[/bold] in [red]" in out and "\\x1b[2Jfog\\x07" in out and "\x1b" not in out
    status = run(studio, "status")
    text = status.stdout.decode()
    assert status.returncode == 0 and "Traceback" not in status.stderr.decode()
    assert "\x1b" not in text and "\x07" not in text and "\\x1b[2Jfog" in text
    assert run(studio, "cancel", out.split()[1].rstrip(":")).returncode == 0
    set_value = run(studio, "memory", "set", "user_style", "COLOR_PREFERENCES", "[red]crimson[/red] \x1b]0;pwned\x07")
    assert set_value.returncode == 0, set_value.stderr.decode()
    shown = run(studio, "memory", "show", "user_style")
    assert shown.returncode == 0, shown.stderr.decode()
    assert "[red]crimson[/red]" in shown.stdout.decode() and "\x1b" not in shown.stdout.decode()


def test_a_search_for_text_with_a_lone_surrogate_is_refused_clearly(studio):
    """An agent's query may carry one (a JSON escape in a model's reply): refused by name, not a tokenizer error."""
    with pytest.raises(InvalidInput, match="the search text contains a lone surrogate"):
        ArchivalMemory(studio.settings).search("cats \ud800")


def test_quotes_series_and_variation_words_are_read_in_context(studio):
    from mas.domain.requests import parse_request

    settings = studio.settings
    ab = parse_request('Generate 3 variations of "the 3-part series of a fox"', settings)
    assert (ab.kind, ab.count, ab.theme) == ("ab", 3, "the 3-part series of a fox")
    quoted = parse_request('Create a video of "a sign reading "OPEN" at dusk"', settings)
    assert quoted.theme == 'a sign reading "OPEN" at dusk'
    series = parse_request("Create a 3-part The Deep Blue Sea series", settings)
    assert (series.kind, series.series_name) == ("series", "The Deep Blue Sea")
    named = parse_request('Create a 3-part The "Deep" Sea series', settings)  # `mas series 'The "Deep" Sea'`
    assert (named.kind, named.series_name) == ("series", 'The "Deep" Sea')
    batch = parse_request("Create 3 videos of a 2-part series poster", settings)
    assert (batch.kind, batch.count, batch.theme) == ("batch", 3, "a 2-part series poster")


SERVE_DEADLINE = 180
"""Seconds `mas serve` gets to answer its first request: it starts in a second or two, far longer on a
shared, loaded machine. The wait ends at its first answer."""


def first_answer(proc: subprocess.Popen, url: str, *, auth: tuple[str, str] | None = None) -> httpx.Response:
    """The first answer of the `mas serve` starting in `proc`, polled until it answers, exits or the deadline."""
    deadline = time.monotonic() + SERVE_DEADLINE
    while True:
        try:
            return httpx.get(url, auth=auth, timeout=10)
        except httpx.HTTPError:
            if proc.poll() is not None:
                pipe = proc.stderr or proc.stdout
                said = pipe.read().decode(errors="replace")[-2000:] if pipe else ""
                raise AssertionError(f"mas serve exited ({proc.returncode}) before answering: {said}") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"mas serve did not answer {url} within {SERVE_DEADLINE} s") from None
            time.sleep(0.5)


@pytest.fixture(scope="module")
def gallery(studio):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "mas.cli", "serve", "--port", str(port)], env=studio.env,
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        first_answer(proc, url + "/")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize("path", [
    "/batches/" + "7" * 4000, "/ab/" + "9" * 30, "/videos/" + "1" * 200 + "/frames.jpg",
    "/api/v1/batches/99999999999999999999", "/files/" + "a" * 5000, "/files/" + "/".join(["b" * 300] * 3),
    "/files/../../etc/passwd",
])
def test_the_gallery_answers_404_not_500_to_ids_and_paths_it_cannot_have(studio, gallery, path):
    before = snapshot(studio)
    response = httpx.get(gallery + path, timeout=30)
    assert response.status_code == 404, (response.status_code, response.text[:300])
    assert snapshot(studio) == before


def test_no_secret_reaches_output_logs_stored_reasons_or_the_gallery(tmp_path):
    """A studio configured with secrets in every URL form: a password in the user-info (with characters
    that break URL parsing), a token in the query, a bare token user-info, an API key. A render fails
    against that ComfyUI URL, so the URL is in the error; none of the secrets is anywhere."""
    from tests.comfyui_real import NODE_MAP, write_workflow

    closed = free_port()  # nothing listens there
    secrets = ["c0mfy-p%40ss%3Aw", "qu3ry-t0ken", "sk-llm-k3y-123456", "l3tta-t0ken", "g4llery-pw"]
    env = {
        "MAS_VIDEO_BACKEND": "comfyui", "MAS_COMFYUI_WORKFLOW": str(write_workflow(tmp_path / "wf.json", seconds=0.1)),
        "MAS_COMFYUI_NODES": json.dumps(NODE_MAP), "MAS_COMFYUI_RETRIES": "0", "MAS_STEP_RETRIES": "0",
        "MAS_COMFYUI_URL": f"http://mas:{secrets[0]}@127.0.0.1:{closed}/?token={secrets[1]}",
        "MAS_LLM_API_KEY": secrets[2], "MAS_LETTA_URL": f"http://{secrets[3]}@127.0.0.1:{closed}",
        "MAS_GALLERY_USER": "me", "MAS_GALLERY_PASSWORD": secrets[4],
    }
    data = tmp_path / "studio"
    data.mkdir()
    data.chmod(0o755)
    tmp_path.chmod(0o755)
    with IsolatedStudio(data, **env) as studio:
        studio.worker("cpu")
        studio.worker("gpu")
        batch_id = studio.enqueue("Create a video of a lighthouse")
        studio.wait_batch(batch_id, timeout=600)  # seconds alone; minutes on a loaded 2-core machine
        outputs = [run(studio, *args) for args in (("status", str(batch_id)), ("videos",), ("services",),
                                                   ("memory", "show"), ("enqueue", "Create 2 videos of"))]
        with db.session_scope(studio.settings) as s:
            stored = json.dumps([list(row) for row in s.execute(sa.text(
                "select v.failure_reasons, a.failure_reasons from videos v join attempts a on a.video_id = v.id"
            )).all()])
            stored += json.dumps(s.execute(sa.text("select value from memory_blocks")).scalars().all())
        with subprocess.Popen([sys.executable, "-m", "mas.cli", "serve", "--port", str(closed)], env=studio.env,
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as serve:
            page = first_answer(serve, f"http://127.0.0.1:{closed}/batches/{batch_id}", auth=("me", secrets[4])).text
            serve.terminate()
            served = serve.communicate(timeout=10)[0].decode(errors="replace")
        logs = "".join(w.log.read_text(errors="replace") for w in studio.workers)
    assert "failed" in stored and "127.0.0.1" in stored  # the reason is there, with the server's address
    assert page and "lighthouse" in page
    everything = stored + page + served + logs + "".join(
        (r.stdout + r.stderr).decode(errors="replace") for r in outputs)
    leaked = [secret for secret in [*secrets, "p@ss:w"] if secret in everything]
    assert not leaked, leaked


def test_a_password_that_breaks_url_parsing_is_not_shown_by_services_or_errors(studio):
    """Characters a URL parser stops at (@ : / # ? in the password, a port that is not a number)."""
    for env in (
        {"MAS_DATABASE_URL": "postgresql://mas:p@ss:w/rd#x?y@127.0.0.1:1/mas"},
        {"MAS_BROKER_URL": "redis://:r3d-p@ss/w#rd@127.0.0.1:1/0"},
        {"MAS_BROKER_URL": "redis://127.0.0.1:1/0?password=r3d-qu3ry-pw"},
        {"MAS_DATABASE_URL": "postgresql://mas:db-pw-123@127.0.0.1:99999/mas"},
    ):
        for args in (("services",), ("status",)):
            result = run(studio, *args, env=env)
            out = (result.stdout + result.stderr).decode(errors="replace")
            assert "Traceback" not in out, out
            for secret in ("p@ss:w/rd", "w/rd#x", "r3d-p@ss", "r3d-qu3ry-pw", "db-pw-123"):
                assert secret not in out, (env, args, out)
