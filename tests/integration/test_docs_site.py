"""The documentation site builds with warnings as errors, and its references are the code's.

`mkdocs build --strict` (as CI runs it) into a temporary folder: a broken link, a missing page or anchor, a
snippet that names a file or section that is gone, or a generated reference that fails to render stops it. The
generated references are then checked against what they are made from: the OpenAPI document the app serves
and the command tree of `mas`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mas.api import create_api
from mas.cli import main
from mas.config import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_the_site_builds_strictly_and_its_references_are_generated_from_the_code(tmp_path):
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr

    published = json.loads((site / "reference" / "openapi.json").read_text())
    assert published == create_api(Settings()).openapi()
    api = (site / "reference" / "api" / "index.html").read_text()
    assert all(path in api for path in published["paths"])

    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert all(f"mas {name}" in cli for name in main.commands)

    settings = (site / "reference" / "settings" / "index.html").read_text()
    assert "MAS_DATABASE_URL" in settings and "MAS_REDIS_SENTINEL_PASSWORD" in settings

    step = (site / "contributing" / "adding-a-step" / "index.html").read_text()
    assert "upscale_video" in step  # the walk-through is the code tests/system/test_add_a_step.py applies
