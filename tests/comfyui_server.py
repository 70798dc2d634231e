"""A protocol stand-in for a ComfyUI 0.3.x server, for tests. It is not ComfyUI: it runs no nodes.

It answers the routes the `comfyui` backend uses the way DESIGN.md ("ComfyUI protocol") records a real
server answering them: POST /prompt, GET /history/{id}, GET /view, POST /queue, POST /interrupt, POST /free,
GET /system_stats and the websocket /ws?clientId=. Every "render" plays the scripted events and then
reports one real small mp4 (the file it was given) as the SaveVideo output. It serves on 127.0.0.1 on an
ephemeral port from a background thread, and records what it received so tests can check it.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import struct
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Self

from aiohttp import WSCloseCode, web

PREVIEW_FRAME = struct.pack(">II", 1, 1) + b"\xff\xd8 not really a jpeg \xff\xd9"  # event 1: preview image


@dataclass(kw_only=True)
class Script:
    """How the stand-in behaves; a test sets it before rendering."""

    outcome: Literal["success", "reject", "error", "hang"] = "success"
    prompt_failures: int = 0  # answer this many POST /prompt with HTTP 500 first
    websocket: Literal["open", "refuse", "drop"] = "open"  # drop: close it after the first progress
    filename: str = "LTX_2_00001_.mp4"  # what history reports; /view serves the same mp4 for any name
    subfolder: str = "video"
    steps: int = 4
    step_seconds: float = 0.02


@dataclass
class _Job:
    prompt_id: str
    stop: asyncio.Event = field(default_factory=asyncio.Event)


class ComfyUIStandIn:
    """The stand-in server; use it as a context manager."""

    def __init__(self, *, video: Path, script: Script | None = None):
        self.video = video
        self.script = script or Script()
        self.url = ""
        self.prompts: list[dict[str, Any]] = []  # every POST /prompt body, failed ones included
        self.queued: list[str] = []  # ids of the prompts it accepted
        self.websockets: list[str] = []  # clientId of every websocket request, refused ones included
        self.history: dict[str, dict[str, Any]] = {}
        self.views: list[dict[str, str]] = []
        self.deletes: list[str] = []
        self.interrupts: list[dict[str, Any]] = []
        self.frees: list[dict[str, Any]] = []
        self._numbers = itertools.count()
        self._sockets: dict[str, web.WebSocketResponse] = {}
        self._running: _Job | None = None
        self._tasks: set[asyncio.Task] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="comfyui-stand-in", daemon=True)
        self._runner: web.AppRunner | None = None

    def __enter__(self) -> Self:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(sock), self._loop).result(timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _serve(self, sock: socket.socket) -> None:
        app = web.Application()
        app.router.add_post("/prompt", self._prompt)
        app.router.add_get("/history/{prompt_id}", self._history)
        app.router.add_get("/view", self._view)
        app.router.add_post("/queue", self._queue)
        app.router.add_post("/interrupt", self._interrupt)
        app.router.add_post("/free", self._free)
        app.router.add_get("/system_stats", self._system_stats)
        app.router.add_get("/ws", self._websocket)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()

    async def _shutdown(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for ws in list(self._sockets.values()):
            await ws.close(code=WSCloseCode.GOING_AWAY)
        await self._runner.cleanup()

    # --- routes ----------------------------------------------------------------------------------
    async def _prompt(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.prompts.append(body)
        if len(self.prompts) <= self.script.prompt_failures:
            return web.Response(status=500, text="500 Internal Server Error\n\nServer got itself in trouble")
        workflow: dict[str, Any] = body["prompt"]
        if self.script.outcome == "reject":
            return web.json_response(_validation_error(workflow), status=400)
        job, number = _Job(prompt_id=str(uuid.uuid4())), next(self._numbers)
        self.queued.append(job.prompt_id)
        task = asyncio.create_task(self._run(job, workflow, body.get("client_id"), number))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return web.json_response({"prompt_id": job.prompt_id, "number": number, "node_errors": {}})

    async def _history(self, request: web.Request) -> web.Response:
        prompt_id = request.match_info["prompt_id"]
        entry = self.history.get(prompt_id)
        return web.json_response({prompt_id: entry} if entry is not None else {})

    async def _view(self, request: web.Request) -> web.StreamResponse:
        self.views.append(dict(request.query))
        if request.query.get("type") not in ("output", "input", "temp"):
            return web.Response(status=400)
        return web.FileResponse(self.video, headers={"Content-Type": "video/mp4"})

    async def _queue(self, request: web.Request) -> web.Response:
        self.deletes.extend((await request.json()).get("delete", []))
        return web.Response()

    async def _interrupt(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else {}
        self.interrupts.append(body)
        job = self._running
        if job is not None and body.get("prompt_id") in (None, job.prompt_id):
            job.stop.set()
        return web.Response()

    async def _free(self, request: web.Request) -> web.Response:
        self.frees.append(await request.json())
        return web.Response()

    async def _system_stats(self, request: web.Request) -> web.Response:
        gib = 1 << 30
        return web.json_response({
            "system": {"os": "posix", "comfyui_version": "0.3.68 (stand-in)", "ram_total": 128 * gib},
            "devices": [{
                "name": "cuda:0 stand-in GPU", "type": "cuda", "index": 0,
                "vram_total": 80 * gib, "vram_free": 61 * gib,
                "torch_vram_total": 20 * gib, "torch_vram_free": 1 * gib,
            }],
        })

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        sid = request.query.get("clientId") or uuid.uuid4().hex
        self.websockets.append(sid)
        if self.script.websocket == "refuse":
            return web.Response(status=403, text="websockets are not allowed here")
        ws = web.WebSocketResponse(timeout=1)  # seconds to wait for the client's close reply
        await ws.prepare(request)
        self._sockets[sid] = ws
        await ws.send_json({"type": "status", "data": {"status": {"exec_info": {"queue_remaining": 0}}, "sid": sid}})
        try:
            async for _ in ws:
                pass
        finally:
            if self._sockets.get(sid) is ws:
                del self._sockets[sid]
        return ws

    # --- one render ------------------------------------------------------------------------------
    async def _run(self, job: _Job, workflow: dict[str, Any], client_id: str | None, number: int) -> None:
        script = self.script
        messages: list[list[Any]] = []  # what history keeps under status.messages

        async def send(kind: str, data: dict[str, Any], *, keep: bool = False) -> None:
            data = {**data, "prompt_id": job.prompt_id}
            if keep:
                messages.append([kind, {**data, "timestamp": int(time.time() * 1000)}])
            await self._send(client_id, {"type": kind, "data": data})

        def finish(outputs: dict[str, Any], *, ok: bool) -> None:
            self.history[job.prompt_id] = {
                "prompt": [number, job.prompt_id, workflow, {"client_id": client_id}, _saving_nodes(workflow)],
                "outputs": outputs,
                "status": {"status_str": "success" if ok else "error", "completed": ok, "messages": messages},
                "meta": {node: {"node_id": node, "display_node": node} for node in outputs},
            }

        self._running = job
        sampler = _sampler(workflow)
        try:
            await send("execution_start", {}, keep=True)
            await send("execution_cached", {"nodes": []}, keep=True)
            await send("executing", {"node": sampler, "display_node": sampler})
            step = 0
            while step < script.steps or script.outcome == "hang":
                try:
                    await asyncio.wait_for(job.stop.wait(), script.step_seconds)
                except TimeoutError:
                    pass
                else:
                    failed = {"node_id": sampler, "node_type": workflow[sampler]["class_type"], "executed": []}
                    await send("execution_interrupted", failed, keep=True)
                    finish({}, ok=False)
                    break
                step += 1
                if script.outcome != "hang":
                    await send("progress", {"value": step, "max": script.steps, "node": sampler})
                    await self._send_bytes(client_id, PREVIEW_FRAME)
                if script.websocket == "drop" and client_id in self._sockets:
                    await self._sockets[client_id].close(code=WSCloseCode.GOING_AWAY)
                if script.outcome == "error":
                    await send("execution_error", {
                        "node_id": sampler, "node_type": workflow[sampler]["class_type"], "executed": [],
                        "exception_message": "Allocation on device \n", "exception_type": "torch.OutOfMemoryError",
                        "traceback": ["  File \"execution.py\", line 1, in execute\n"],
                        "current_inputs": {}, "current_outputs": {},
                    }, keep=True)
                    finish({}, ok=False)
                    break
            else:
                saved = {"images": [{"filename": script.filename, "subfolder": script.subfolder, "type": "output"}],
                         "animated": [True]}
                outputs = {node: saved for node in _saving_nodes(workflow)}
                for node, output in outputs.items():
                    await send("executed", {"node": node, "display_node": node, "output": output})
                await send("execution_success", {}, keep=True)
                await asyncio.sleep(script.step_seconds)  # a real server writes history after this message
                finish(outputs, ok=True)
            await send("executing", {"node": None})
        finally:
            self._running = None

    async def _send(self, client_id: str | None, message: dict[str, Any]) -> None:
        ws = self._sockets.get(client_id or "")
        if ws is not None and not ws.closed:
            await ws.send_json(message)

    async def _send_bytes(self, client_id: str | None, data: bytes) -> None:
        ws = self._sockets.get(client_id or "")
        if ws is not None and not ws.closed:
            await ws.send_bytes(data)


def _saving_nodes(workflow: dict[str, Any]) -> list[str]:
    return [node for node, spec in workflow.items() if spec["class_type"] == "SaveVideo"]


def _sampler(workflow: dict[str, Any]) -> str:
    """The node a render "runs" in: the first sampler, else the first node."""
    samplers = [node for node, spec in workflow.items() if spec["class_type"].startswith("Sampler")]
    return (samplers or list(workflow))[0]


def _validation_error(workflow: dict[str, Any]) -> dict[str, Any]:
    """A 400 body as ComfyUI writes it when a node's required input is missing."""
    texts = [node for node, spec in workflow.items() if spec["class_type"] == "PrimitiveStringMultiline"]
    node = (texts or list(workflow))[0]
    return {
        "error": {
            "type": "prompt_outputs_failed_validation", "message": "Prompt outputs failed validation",
            "details": "", "extra_info": {},
        },
        "node_errors": {
            node: {
                "errors": [{
                    "type": "required_input_missing", "message": "Required input is missing",
                    "details": "value", "extra_info": {"input_name": "value"},
                }],
                "dependent_outputs": _saving_nodes(workflow),
                "class_type": workflow[node]["class_type"],
            }
        },
    }
