"""/metrics scraped by a real Prometheus: what it stores for a finished batch is what PostgreSQL and Redis say.

An isolated studio with real workers runs a small batch; the gallery (as `mas serve` serves it, behind its
basic auth) is scraped every second by Debian's Prometheus, and the figures are asked back through
Prometheus's HTTP API with PromQL, from a scrape that began after the batch was done.
"""

from __future__ import annotations

import base64
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from mas import db, names
from mas.models import AgentCall, Attempt, Video, VideoState, WebhookEvent
from mas.pipeline import rows
from mas.reports.metrics import FIGURES
from mas.reports.queries import gpu_summary
from tests.harness.gallery import served_gallery
from tests.harness.processes import Server
from tests.parts import need
from tests.ports import free_port
from tests.studio import IsolatedStudio
from tests.unit.test_dashboard import dashboard_queries

PROMETHEUS = shutil.which("prometheus")
USER, PASSWORD = "scraper", "not-a-real-secret"
WEBHOOK_SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()

need(
    "PROMETHEUS",
    None if PROMETHEUS else "the prometheus server is not installed: apt-get install -y prometheus",
    module=True,
)


def _until(condition, *, timeout: float, what: str):
    """Poll `condition` until it answers something true; its answer, or TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if answer := condition():
            return answer
        time.sleep(0.2)
    raise TimeoutError(f"timed out waiting for {what}")


class Prometheus(Server):
    """A Prometheus server of its own, scraping one target every second with basic auth; started ready."""

    def __init__(self, folder: Path, *, target: str) -> None:
        super().__init__(folder, address="127.0.0.1")
        folder.mkdir()
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [
                {
                    "job_name": "mas",
                    "static_configs": [{"targets": [target]}],
                    "basic_auth": {"username": USER, "password": PASSWORD},
                }
            ],
        }
        (folder / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = folder / "prometheus.log"
        argv = [PROMETHEUS, f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}"]  # fmt: skip
        try:
            self.launch(argv, what="prometheus", timeout=60, interval=0.2)
        except BaseException:
            self.stop()
            raise

    def answering(self) -> bool:
        try:
            return httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def query(self, promql: str) -> list[dict]:
        reply = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10).json()
        assert reply["status"] == "success", reply
        return reply["data"]["result"]

    def value(self, promql: str) -> float | None:
        """The value of a query that answers one number (None when it answers nothing)."""
        result = self.query(promql)
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else None


@pytest.fixture
def studio() -> Iterator[IsolatedStudio]:
    env = {
        "MAS_PREVIEW_RENDER_SECONDS": "0.3",
        "MAS_GALLERY_USER": USER,
        "MAS_GALLERY_PASSWORD": PASSWORD,
        "MAS_WEBHOOK_URL": "http://127.0.0.1:9/nobody-listens",  # events wait in the outbox: no deliverer runs
        "MAS_WEBHOOK_SECRET": WEBHOOK_SECRET,
    }
    with tempfile.TemporaryDirectory(prefix="mas-metrics-") as tmp:
        Path(tmp).chmod(0o755)  # the embedded PostgreSQL runs as another user when we are root
        with IsolatedStudio(Path(tmp), **env) as s:
            yield s


@pytest.fixture
def gallery(studio) -> Iterator[str]:
    """The gallery on a free loopback port, served as `mas serve` serves it (credentials set: basic auth)."""
    with served_gallery(studio.settings) as served:
        yield served.address


@pytest.fixture
def prometheus(studio, gallery) -> Iterator[Prometheus]:
    prom = Prometheus(studio.data_dir / "prometheus", target=gallery)
    try:
        yield prom
    finally:
        prom.stop()


def _after(prom: Prometheus, moment: float) -> None:
    """Wait for a scrape of the studio that began after `moment`, and check both sources were read in it.

    A sample's time is the start of its scrape; `timestamp()` gives it only of a plain selector."""
    _until(
        lambda: (prom.value("min(timestamp(mas_source_up))") or 0) > moment,
        timeout=60,
        what=f"a scrape after the batch; targets: {prom.query('up')}",
    )
    assert prom.value("min(mas_source_up)") == 1, prom.query("mas_source_up")


def test_prometheus_reports_the_finished_batch(studio, prometheus):
    studio.worker("cpu", concurrency=2)
    studio.worker("gpu")
    batch_id = studio.enqueue("Create 3 videos of brass lighthouses")
    studio.wait_batch(batch_id, timeout=300)
    with db.session_scope(studio.settings) as s:
        accepted = s.scalar(
            sa.select(sa.func.count()).where(Video.batch_id == batch_id, Video.state == VideoState.accepted)
        )
        renders = s.scalar(
            sa.select(sa.func.count())
            .select_from(Attempt)
            .join(Video)
            .where(Video.batch_id == batch_id, Attempt.render_seconds.is_not(None))
        )
        gradings = s.scalar(
            sa.select(sa.func.count())
            .select_from(Attempt)
            .join(Video)
            .where(Video.batch_id == batch_id, Attempt.grade.is_not(None))
        )
        events = s.scalar(sa.select(sa.func.count()).select_from(WebhookEvent))
        # agent calls as the llm backend records them (the offline agents record none): one of them invalid
        s.add_all(
            AgentCall(agent="writer", task="write", tries=t, valid=t == 1, seconds=0.4 * t, prompt_tokens=100,
                      cached_tokens=60, completion_tokens=20)
            for t in (1, 2)
        )  # fmt: skip
    for key, tries in (("7", 1), ("8", 2)):  # a schedule failing, another parked (after MAS_ROW_MAX_TRIES 2)
        for _ in range(tries):
            rows.record(studio.settings.changed(row_max_tries=2), "schedules", key, ValueError("year 1"))
    assert renders >= 3 and events >= 3  # every video rendered and reported (accepted or failed)
    # the gpu worker publishes its turns after each gpu task ends, which may be just after the batch is done
    worker = _until(
        lambda: next((w for w in gpu_summary(studio.settings).workers if w.turns >= renders + gradings), None),
        timeout=60,
        what="the gpu worker's stats of every render and grading",
    )
    _after(prometheus, time.time())

    assert prometheus.value('sum(mas_videos{state="accepted"}) or vector(0)') == accepted
    assert prometheus.value("sum(mas_videos)") == 3
    assert prometheus.value('sum(mas_render_seconds_count{backend="preview"})') == renders
    assert prometheus.value('sum(mas_render_seconds_bucket{le="+Inf"})') == renders
    if accepted:
        assert prometheus.value("mas_accepted_video_attempts_count") == accepted
    assert prometheus.value('mas_agent_call_seconds_count{task="write"}') == 2
    assert prometheus.value('mas_agent_call_seconds_bucket{task="write",le="0.5"}') == 1
    assert prometheus.value('mas_agent_invalid_replies_total{task="write"}') == 1
    assert prometheus.value('mas_agent_tokens_total{task="write",kind="cached"}') == 120
    assert prometheus.value("sum(mas_webhook_events)") == events
    assert prometheus.value('mas_row_faults{rows="schedules",state="failing"}') == 1
    assert prometheus.value('mas_row_faults{rows="schedules",state="parked"}') == 1
    labels = {"worker": worker.name, "device": worker.device}
    selector = ",".join(f'{k}="{v}"' for k, v in labels.items())
    assert prometheus.value(f"mas_gpu_turns_total{{{selector}}}") == worker.turns
    assert prometheus.value(f"mas_gpu_busy_seconds_total{{{selector}}}") == pytest.approx(worker.busy_seconds)
    waiting = prometheus.query("mas_queue_waiting")
    assert {r["metric"]["queue"] for r in waiting} == {q for qs in names.WORKER_QUEUES.values() for q in qs}
    assert {r["metric"]["priority"] for r in waiting} == {"0", "3", "6", "9"}

    for expr in dashboard_queries():  # Grafana's dashboard asks this Prometheus nothing it cannot answer
        prometheus.query(expr)

    declared = {series for figure in FIGURES for series in figure.series}
    scraped = {r["metric"]["__name__"] for r in prometheus.query('{__name__=~"mas_.+"}')}
    assert scraped <= declared, scraped - declared
