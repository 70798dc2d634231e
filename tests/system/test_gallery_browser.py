"""The gallery in headless Chromium, as a user meets it: live progress from the event stream, a finished batch's
videos, a pick.

It drives Debian's chromium package through Playwright (never a downloaded browser) against the gallery
served by `mas.gallery.server` on a free loopback port, with real workers rendering the A/B test. The
screenshots are kept under test-artifacts/ for a person to look at.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from playwright.sync_api import Page, expect, sync_playwright

from mas.cli import main
from mas.db import session_scope
from mas.domain.identity import STUDIO
from mas.memory import blocks
from mas.models import ABTest, ABVariation, Batch, StudioEvent, Video
from tests.harness.gallery import served_gallery
from tests.parts import need

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

need(
    "CHROMIUM",
    None if CHROMIUM.exists() else "Debian's chromium is not installed: apt-get install -y chromium",
    module=True,
)


@pytest.fixture(scope="module")
def gallery_url(settings) -> Iterator[str]:
    """The gallery on a free loopback port, served the way `mas serve` serves it."""
    with served_gallery(settings) as served:
        yield served.url


@pytest.fixture
def browser(tmp_path) -> Iterator[tuple[Page, list[str]]]:
    """A page of a fresh headless Chromium profile, and the script errors it reports."""
    errors: list[str] = []
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            tmp_path / "profile",
            executable_path=str(CHROMIUM),
            headless=True,
            args=FLAGS,
            viewport={"width": 1280, "height": 900},
        )
        page = context.pages[0] if context.pages else context.new_page()
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        yield page, errors
        context.close()


@pytest.mark.usefixtures("workers")
def test_open_a_finished_batch_and_pick_an_ab_winner(settings, gallery_url, browser):
    page, script_errors = browser
    result = CliRunner().invoke(main, ["ab", "a kite over the dunes", "--variations", "2"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    batch_id = int(result.output.split()[1].rstrip(":"))

    # the index is open while the batch renders: it follows the event stream from the event it was rendered at,
    # and its row turns "done" from the stream's events, without a reload and without polling
    requests: list[tuple[str, str]] = []
    page.on("request", lambda request: requests.append((request.resource_type, request.url)))
    page.goto(f"{gallery_url}/")
    stream = page.locator("body").get_attribute("data-stream")
    assert stream is not None and stream.startswith("/api/v1/events?after=")
    row = page.locator(f'tr[data-batch="{batch_id}"]')
    expect(row.locator(".status")).to_have_text("done", timeout=150_000)
    expect(row.locator(".count")).to_have_text("2/2")
    after = int(stream.rpartition("=")[2])
    with session_scope(settings) as s:
        events = s.scalars(
            sa.select(StudioEvent.id)
            .where(StudioEvent.batch_id == batch_id, StudioEvent.id > after)
            .order_by(StudioEvent.id)
        ).all()
    assert int(row.get_attribute("data-event") or 0) in events  # the row was last refreshed for this event
    assert ("eventsource", f"{gallery_url}{stream}") in requests
    refreshes = [url for kind, url in requests if kind == "fetch" and url.endswith(f"/api/v1/batches/{batch_id}")]
    assert 1 <= len(refreshes) <= len(events), (len(refreshes), len(events))  # each refresh answers an event
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=ARTIFACTS / "gallery-index.png", full_page=True, animations="disabled")

    row.get_by_role("link", name=f"#{batch_id}", exact=True).click()
    expect(page).to_have_url(f"{gallery_url}/batches/{batch_id}")
    videos = page.locator("video")
    expect(videos).to_have_count(2)
    # Chromium itself loaded each file and decoded its first frame; each frame strip is a real image (functions,
    # not expressions: the page's Content-Security-Policy refuses the eval an expression is polled with)
    page.wait_for_function(
        "() => [...document.querySelectorAll('video')].every(v => v.readyState >= 2 && v.duration > 0)",
        timeout=15_000,
    )
    page.wait_for_function(
        "() => [...document.querySelectorAll('img.strip')].every(i => i.complete && i.naturalWidth > 0)",
        timeout=15_000,
    )
    expect(page.locator(".prompt")).to_have_count(2)
    page.screenshot(path=ARTIFACTS / "gallery-batch.png", full_page=True, animations="disabled")

    page.get_by_role("link", name="Compare the variations side by side").click()
    cards = page.locator("#variations > div")
    expect(cards).to_have_count(2)
    a, b = cards.nth(0).bounding_box(), cards.nth(1).bounding_box()
    assert a["y"] == b["y"] and a["x"] + a["width"] <= b["x"]  # side by side
    with session_scope(settings) as s:
        test_id = s.get(Batch, batch_id).ab_test_id
        picked_video = s.scalar(sa.select(Video.id).where(Video.batch_id == batch_id, Video.label == "B"))
    before = blocks.read(settings, STUDIO, "ab_testing")
    assert before["ACTIVE_TEST"] == str(test_id)
    page.screenshot(path=ARTIFACTS / "gallery-ab-open.png", full_page=True, animations="disabled")

    page.get_by_role("button", name="Pick B as the winner").click()
    expect(page.locator("#winner")).to_contain_text("Winner: B")
    expect(page.get_by_role("button")).to_have_count(0)
    expect(page.locator(f'[data-video="{picked_video}"]')).to_have_class("card winner")
    page.screenshot(path=ARTIFACTS / "gallery-ab.png", full_page=True, animations="disabled")

    after = blocks.read(settings, STUDIO, "ab_testing")
    assert after["USER_SELECTIONS"][-1]["test"] == str(test_id) and after["USER_SELECTIONS"][-1]["label"] == "B"
    assert after["ACTIVE_TEST"] is None and len(after["USER_SELECTIONS"]) == len(before["USER_SELECTIONS"]) + 1
    with session_scope(settings) as s:
        test = s.get(ABTest, test_id)
        assert (test.status, test.winner_label) == ("closed", "B")
        approach = s.scalar(
            sa.select(ABVariation.approach).where(ABVariation.test_id == test_id, ABVariation.label == "B")
        )

    # what the pick taught the studio shows with the learned style
    page.get_by_role("link", name="Memory & style").click()
    expect(page.locator("#learned-style")).to_contain_text(approach)
    expect(page.locator("#block-ab_testing")).to_contain_text(f'"test": "{test_id}"')
    page.screenshot(path=ARTIFACTS / "gallery-memory.png", full_page=True, animations="disabled")
    assert script_errors == []


def test_turn_a_style_item_round_and_remove_one_on_the_memory_page(clean, gallery_url, browser):
    """The memory page lists each item with where it came from; its buttons act through the API and the
    `user_style` block every prompt is built from follows. The screenshot with a flipped item is the docs'."""
    page, script_errors = browser
    for args in (
        ["style", "I prefer dark moody aesthetics with purple tones"],
        ["style", "--avoid", "handheld camera"],
    ):
        assert CliRunner().invoke(main, args).exit_code == 0
    page.goto(f"{gallery_url}/memory")
    items = page.locator("#style-items tr[data-item]")
    expect(items).to_have_count(4)
    purple = items.filter(has_text="likes: purple (colour)")
    expect(purple).to_contain_text("read from feedback by the studio's rules")

    purple.get_by_role("button", name="Rule it out").click()
    flipped = page.locator("#style-items tr[data-item]", has_text="rules out: purple (colour)")
    expect(flipped).to_contain_text("corrected by the user")
    expect(flipped).to_contain_text("before: purple, liked (read from feedback by the studio's rules)")
    assert blocks.read(clean, STUDIO, "user_style")["DISLIKED_ELEMENTS"] == ["handheld camera", "purple"]
    docs = Path(__file__).resolve().parents[2] / "docs" / "images"
    page.locator("#style-items").screenshot(path=docs / "memory-page.png", animations="disabled")

    items.filter(has_text="handheld camera").get_by_role("button", name="Remove").click()
    expect(page.locator("#style-items tr[data-item]")).to_have_count(3)
    assert blocks.read(clean, STUDIO, "user_style")["DISLIKED_ELEMENTS"] == ["purple"]
    assert script_errors == []
