"""A ComfyUI workflow template checked when the backend is built, before any server is asked: the nodes the
settings name, the file's format, the factory's choice. No server (the URL is a closed port)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu.comfyui import ComfyUIBackend, WorkflowError
from gpu.factory import video_backend
from tests.integration.test_comfyui import NODES, closed_port_url, ltx2_workflow, settings_for


@pytest.fixture
def template(tmp_path) -> Path:
    """LTX-2's API-format workflow, as a user exports it from ComfyUI."""
    path = tmp_path / "ltx2_api.json"
    path.write_text(json.dumps(ltx2_workflow()))
    return path


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        ({**NODES, "prompt": "9999.value"}, r"has no node '9999' \(MAS_COMFYUI_NODES\[prompt\] = '9999.value'\)"),
        ({**NODES, "prompt": "5222.text"}, r"node 5222 \(PrimitiveStringMultiline\) of .* has no input 'text'"),
        ({**NODES, "seed": "5232:5158"}, r"MAS_COMFYUI_NODES\[seed\] = '5232:5158' should be NODE_ID.INPUT_NAME"),
        ({**NODES, "negative_prompt": "5225.text"}, "input 'text' of node 5225 .* is wired to node 5223"),
        ({**NODES, "output": "9"}, r"has no node '9' \(MAS_COMFYUI_NODES\[output\]"),
        ({k: v for k, v in NODES.items() if k != "seed"}, r"MAS_COMFYUI_NODES lacks \['seed'\]"),
        ({**NODES, "promt": "5222.value"}, r"unknown keys \['promt'\]"),
    ],
)
def test_a_template_that_cannot_take_the_values_fails_when_the_backend_is_built(template, nodes, message):
    with pytest.raises(WorkflowError, match=message):
        ComfyUIBackend(settings=settings_for(closed_port_url(), template, comfyui_nodes=nodes))


def test_unusable_workflow_files_fail_with_what_to_do(tmp_path):
    ui = tmp_path / "ui.json"
    ui.write_text(json.dumps({"nodes": [], "links": [], "version": 0.4}))
    with pytest.raises(WorkflowError, match="UI-format workflow; export it in API format"):
        ComfyUIBackend(settings=settings_for(closed_port_url(), ui))
    with pytest.raises(WorkflowError, match="MAS_COMFYUI_WORKFLOW is not set"):
        ComfyUIBackend(settings=settings_for(closed_port_url(), None))  # type: ignore[arg-type]
    with pytest.raises(WorkflowError, match="cannot read the ComfyUI workflow"):
        ComfyUIBackend(settings=settings_for(closed_port_url(), tmp_path / "missing.json"))


def test_the_factory_builds_the_comfyui_backend_from_settings(template):
    settings = settings_for("http://comfy.example:8188", template, comfyui_retries=5)
    backend = video_backend(settings)
    assert isinstance(backend, ComfyUIBackend) and backend.name == "comfyui"
    assert backend.client.url == "http://comfy.example:8188" and backend.client.retries == 5
    assert backend.timeout < settings.gpu.max_render_seconds  # stops before Celery's hard time limit kills it
