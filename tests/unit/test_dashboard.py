"""The Grafana dashboard asks only for figures the studio exports, through the provisioned data source. Files
only: no Prometheus, no Grafana."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from mas.reports.metrics import FIGURES

ROOT = Path(__file__).resolve().parents[2]


def dashboard_queries() -> list[str]:
    """Every PromQL expression of the studio's Grafana dashboard."""
    dashboard = json.loads((ROOT / "compose" / "grafana" / "dashboards" / "studio.json").read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


def test_dashboard_queries_only_what_the_studio_exports():
    exported = {series for figure in FIGURES for series in figure.series}
    queried = {name for expr in dashboard_queries() for name in re.findall(r"\bmas_[a-z_]+", expr)}
    assert queried <= exported, queried - exported
    for figure in ("mas_videos", "mas_render_seconds_bucket", "mas_agent_call_seconds_bucket", "mas_queue_waiting",
                   "mas_gpu_busy_seconds_total", "mas_webhook_events"):
        assert figure in queried, figure
    grafana = ROOT / "compose" / "grafana"
    sources = yaml.safe_load((grafana / "provisioning" / "datasources" / "prometheus.yml").read_text())
    uid = sources["datasources"][0]["uid"]
    dashboard = json.loads((grafana / "dashboards" / "studio.json").read_text())
    assert {panel["datasource"]["uid"] for panel in dashboard["panels"] if "datasource" in panel} == {uid}
