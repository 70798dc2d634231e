"""The deployment's compose file passes `docker-compose config` (Debian's docker-compose, offline), and its
monitoring (Prometheus, Grafana's dashboard) asks only for figures the studio exports."""

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.parts import need

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = shutil.which("docker-compose")


@pytest.fixture
def rendered(tmp_path) -> dict:
    need("COMPOSE", None if COMPOSE else "docker-compose is not installed (apt-get install docker-compose)")
    shutil.copytree(ROOT / "compose", tmp_path / "compose")
    shutil.copy(ROOT / "compose" / "env.example", tmp_path / "compose" / ".env")
    result = subprocess.run(
        [COMPOSE, "-f", "compose/docker-compose.yml", "--env-file", "compose/.env",
         "--profile", "letta", "--profile", "comfyui", "--profile", "monitoring", "config"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_compose_file_is_valid_and_complete(rendered):
    services = rendered["services"]
    assert {"redis", "postgres", "cpu-worker", "gpu-worker", "beat", "flower", "letta", "comfyui"} <= set(services)
    redis_cmd = " ".join(services["redis"]["command"])
    assert "--appendonly yes" in redis_cmd and "--maxmemory-policy noeviction" in redis_cmd
    assert "pgvector" in services["postgres"]["image"]
    devices = services["gpu-worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and devices[0]["count"] == 1
    for name in ("redis", "postgres", "cpu-worker", "gpu-worker", "flower"):
        assert "healthcheck" in services[name], name
    assert "container_name" not in services["cpu-worker"] and "ports" not in services["cpu-worker"]  # scalable
    assert all(str(p).startswith("127.0.0.1:") for p in services["flower"]["ports"])  # loopback only
    assert services["cpu-worker"]["environment"]["MAS_BROKER_URL"] == "redis://redis:6379/0"


def test_monitoring_scrapes_the_studio_and_flower(rendered):
    services = rendered["services"]
    gallery = services["gallery"]
    assert gallery["command"][:2] == ["mas", "serve"] and "profiles" not in gallery and "healthcheck" in gallery
    for name in ("prometheus", "grafana"):
        assert services[name]["profiles"] == ["monitoring"], name
    for name in ("gallery", "prometheus", "grafana"):
        assert all(str(p).startswith("127.0.0.1:") for p in services[name]["ports"]), name  # loopback only
    config = yaml.safe_load((ROOT / "compose" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["mas"]["static_configs"][0]["targets"] == ["gallery:8000"]
    assert set(jobs["mas"]["basic_auth"]) == {"username_file", "password_file"}  # the gallery asks for its login
    assert jobs["flower"]["static_configs"][0]["targets"] == ["flower:5555"]
    command = services["prometheus"]["command"][0]
    assert all(jobs["mas"]["basic_auth"][key] in command for key in ("username_file", "password_file"))




