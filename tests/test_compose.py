"""The deployment's compose file passes `docker-compose config` (Debian's docker-compose, offline)."""

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = shutil.which("docker-compose")


@pytest.fixture
def rendered(tmp_path) -> dict:
    if COMPOSE is None:
        pytest.skip("docker-compose is not installed (apt-get install docker-compose)")
    shutil.copytree(ROOT / "compose", tmp_path / "compose")
    shutil.copy(ROOT / "compose" / "env.example", tmp_path / "compose" / ".env")
    result = subprocess.run(
        [COMPOSE, "-f", "compose/docker-compose.yml", "--env-file", "compose/.env",
         "--profile", "letta", "--profile", "comfyui", "config"],
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
