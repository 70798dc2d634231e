"""The checks at the edge that need no server: a schedule's time, a row id, a client's text, and the headers'
policy."""

from __future__ import annotations

import base64
import hashlib
from datetime import UTC, datetime, timedelta, timezone

import pytest

from mas.config import Settings
from mas.db import MAX_ROW_ID, is_row_id
from mas.errors import InvalidInput
from mas.gallery.headers import page_policy
from mas.pipeline.production import check_run_at
from mas.text import check_plain


@pytest.mark.parametrize(
    "run_at",
    [
        datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14))),
        datetime(9999, 12, 31, 23, 59, tzinfo=timezone(timedelta(hours=-14))),
        datetime.now(UTC) + timedelta(days=367),
        datetime.now(UTC) - timedelta(days=2),
        datetime.now() + timedelta(hours=1),  # no time zone: which 02:00?
    ],
)
def test_a_schedule_time_out_of_its_bounds_is_refused(run_at):
    with pytest.raises(InvalidInput, match="schedule's time"):
        check_run_at(Settings(), run_at)


def test_a_schedule_time_within_its_bounds_passes_and_the_bound_is_a_setting():
    now = datetime.now(UTC)
    for run_at in (now, now - timedelta(hours=23), now + timedelta(days=365), (now + timedelta(days=1)).astimezone()):
        check_run_at(Settings(), run_at)
    with pytest.raises(InvalidInput, match="7 days ahead"):
        check_run_at(Settings(schedule_max_days_ahead=7), now + timedelta(days=8))


def test_only_a_positive_postgresql_integer_is_a_row_id():
    assert [is_row_id(v) for v in (1, MAX_ROW_ID)] == [True, True]
    assert not any(is_row_id(v) for v in (0, -1, -(2**31) - 1, MAX_ROW_ID + 1, 10**30))


@pytest.mark.parametrize("text", ["a\x00b", "\x1b[2J", "\x7f", "\x08", "\ud800", "\x0c"])
def test_a_control_character_or_lone_surrogate_is_refused_naming_where(text):
    with pytest.raises(InvalidInput, match=r"theme contains U\+[0-9A-F]{4} at character \d"):
        check_plain(text, "theme")


def test_plain_text_passes_line_breaks_tabs_and_emoji_included():
    for text in ("owls at dusk", "line one\nline two\r\n\tindented", "family 👨\u200d👩\u200d👧", "ça va, 東京"):
        assert check_plain(text, "request") == text


def test_the_page_policy_frames_nothing_and_runs_only_the_page_s_own_script_and_style():
    page = "<style>p {}</style><p>text</p><script>go()</script>"
    directives = dict(part.strip().split(" ", 1) for part in page_policy(page).split(";"))
    assert directives["frame-ancestors"] == "'none'" and directives["default-src"] == "'none'"
    assert directives["script-src"] == f"'sha256-{base64.b64encode(hashlib.sha256(b'go()').digest()).decode()}'"
    assert directives["style-src"] == f"'sha256-{base64.b64encode(hashlib.sha256(b'p {}').digest()).decode()}'"
    assert "unsafe" not in page_policy(page)
