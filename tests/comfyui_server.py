"""A fault-injection stand-in for a ComfyUI 0.3.75 server, for tests. It is not ComfyUI: it runs no nodes.

It answers the routes the `comfyui` backend uses the way ComfyUI 0.3.75's server.py does (as read in that
release's server.py): POST /prompt (with a client-chosen `prompt_id`, which it
does not de-duplicate), GET /queue (running and pending prompts as `[number, prompt_id, prompt,
extra_data, outputs]`), POST /queue (`delete`, `clear`), GET /history/{id}, POST /history (`delete`,
`clear`), GET /view, POST /interrupt (targeted by `prompt_id`, or global), POST /free, GET /system_stats
and the websocket /ws?clientId=. One worker runs accepted prompts one at a time, lowest number first, and
goes on running a prompt whose client went away; a prompt's events go to its submitter's session. Every
"render" plays the scripted events (`Script`: failures, rejections, errors, hangs, dropped or refused
websockets) and then reports one real small mp4 (the file it was given) as the SaveVideo output. It serves
on 127.0.0.1 on an ephemeral port from a background thread, and records what it received and how many
times it rendered each prompt id (`executions_of`), so tests can check it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import struct
import threading
import time
import uuid
from collections import Counter
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
    """One accepted prompt, as the server's queue holds it."""

    number: float
    prompt_id: str
    workflow: dict[str, Any]
    extra_data: dict[str, Any]
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def client_id(self) -> str | None:
        return self.extra_data.get("client_id")

    def listed(self) -> list[Any]:
        """The job as GET /queue and the history entry list it: [number, prompt_id, prompt, extra_data, outputs]."""
        return [self.number, self.prompt_id, self.workflow, self.extra_data, _saving_nodes(self.workflow)]


def write_workflow(path: Path) -> Path:
    """The smallest workflow template the studio's ComfyUI backend takes (a prompt, a seed, a saved video), for
    the stand-in, written to `path`."""
    path.write_text(json.dumps({
        "5222": {"class_type": "PrimitiveStringMultiline", "inputs": {"value": "placeholder"}},
        "5232:5158": {"class_type": "RandomNoise", "inputs": {"noise_seed": 0}},
        "5075": {"class_type": "SaveVideo", "inputs": {"filename_prefix": "LTX_2"}},
    }))  # fmt: skip
    return path


class ComfyUIStandIn:
    """The stand-in server; use it as a context manager."""

    def __init__(self, *, video: Path, script: Script | None = None):
        self.video = video
        self.script = script or Script()
        self.url = ""
        self.prompts: list[dict[str, Any]] = []  # every POST /prompt body, failed ones included
        self.queued: list[str] = []  # ids of the prompts it accepted, in order (an id sent again counts again)
        self.executions: Counter[str] = Counter()  # prompt id -> how many times a render of it started
        self.successes: Counter[str] = Counter()  # prompt id -> how many renders of it finished well
        self.websockets: list[str] = []  # clientId of every websocket request, refused ones included
        self.history: dict[str, dict[str, Any]] = {}
        self.views: list[dict[str, str]] = []
        self.deletes: list[str] = []  # ids named by POST /queue {"delete": [...]}
        self.history_deletes: list[str] = []  # ids named by POST /history {"delete": [...]}
        self.interrupts: list[dict[str, Any]] = []
        self.frees: list[dict[str, Any]] = []
        self._numbers = itertools.count()
        self._sockets: dict[str, web.WebSocketResponse] = {}
        self._pending: list[_Job] = []
        self._running: _Job | None = None
        self._work_arrived: asyncio.Event | None = None
        self._tasks: set[asyncio.Task] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="comfyui-stand-in", daemon=True)
        self._runner: web.AppRunner | None = None

    def executions_of(self, prompt_id: str) -> int:
        """How many renders of `prompt_id` started (interrupted and failed ones included)."""
        return self.executions[prompt_id]

    def running_prompt(self) -> str | None:
        """The id of the prompt executing now, if any."""
        job = self._running
        return job.prompt_id if job is not None else None

    def pending_prompts(self) -> list[str]:
        """Ids of the prompts waiting in the queue, next first."""
        return [job.prompt_id for job in list(self._pending)]

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
        app.router.add_get("/queue", self._queue)
        app.router.add_post("/queue", self._queue_edit)
        app.router.add_get("/history/{prompt_id}", self._history)
        app.router.add_post("/history", self._history_edit)
        app.router.add_get("/view", self._view)
        app.router.add_post("/interrupt", self._interrupt)
        app.router.add_post("/free", self._free)
        app.router.add_get("/system_stats", self._system_stats)
        app.router.add_get("/ws", self._websocket)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()
        self._work_arrived = asyncio.Event()
        self._start(self._work())

    def _start(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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
        if "number" in body:
            number = float(body["number"])
        else:
            number = next(self._numbers)
            number = -number if body.get("front") else number
        extra_data = dict(body.get("extra_data") or {})
        if "client_id" in body:
            extra_data["client_id"] = body["client_id"]
        extra_data["create_time"] = int(time.time() * 1000)
        job = _Job(
            number=number, prompt_id=str(body.get("prompt_id", uuid.uuid4())), workflow=workflow, extra_data=extra_data
        )
        self.queued.append(job.prompt_id)
        self._pending.append(job)
        self._work_arrived.set()
        return web.json_response({"prompt_id": job.prompt_id, "number": number, "node_errors": {}})

    async def _queue(self, request: web.Request) -> web.Response:  # noqa: ARG002
        running = [self._running.listed()] if self._running is not None else []
        return web.json_response({"queue_running": running, "queue_pending": [job.listed() for job in self._pending]})

    async def _queue_edit(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("clear"):
            self._pending.clear()
        for prompt_id in body.get("delete", []):
            self.deletes.append(prompt_id)
            self._pending = [job for job in self._pending if job.prompt_id != prompt_id]
        return web.Response()

    async def _history(self, request: web.Request) -> web.Response:
        prompt_id = request.match_info["prompt_id"]
        entry = self.history.get(prompt_id)
        return web.json_response({prompt_id: entry} if entry is not None else {})

    async def _history_edit(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("clear"):
            self.history.clear()
        for prompt_id in body.get("delete", []):
            self.history_deletes.append(prompt_id)
            self.history.pop(prompt_id, None)
        return web.Response()

    async def _view(self, request: web.Request) -> web.StreamResponse:
        self.views.append(dict(request.query))
        if request.query.get("type") not in ("output", "input", "temp"):
            return web.Response(status=400)
        return web.FileResponse(self.video, headers={"Content-Type": "video/mp4"})

    async def _interrupt(self, request: web.Request) -> web.Response:
        """Targeted (`{"prompt_id": id}`: only if that prompt is running) or global (no id)."""
        body = await request.json() if request.can_read_body else {}
        self.interrupts.append(body)
        job = self._running
        if job is not None and body.get("prompt_id") in (None, job.prompt_id):
            job.stop.set()
        return web.Response()

    async def _free(self, request: web.Request) -> web.Response:
        self.frees.append(await request.json())
        return web.Response()

    async def _system_stats(self, request: web.Request) -> web.Response:  # noqa: ARG002
        gib = 1 << 30
        return web.json_response(
            {
                "system": {"os": "posix", "comfyui_version": "0.3.75 (stand-in)", "ram_total": 128 * gib},
                "devices": [
                    {
                        "name": "cuda:0 stand-in GPU",
                        "type": "cuda",
                        "index": 0,
                        "vram_total": 80 * gib,
                        "vram_free": 61 * gib,
                        "torch_vram_total": 20 * gib,
                        "torch_vram_free": 1 * gib,
                    }
                ],
            }
        )

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        """A session per clientId; a new connection under an id takes the session over, and the end of
        any connection under an id ends that id's session (as the real server does)."""
        sid = request.query.get("clientId") or uuid.uuid4().hex
        self.websockets.append(sid)
        if self.script.websocket == "refuse":
            return web.Response(status=403, text="websockets are not allowed here")
        ws = web.WebSocketResponse(timeout=1)  # seconds to wait for the client's close reply
        await ws.prepare(request)
        self._sockets.pop(sid, None)
        self._sockets[sid] = ws
        await ws.send_json({"type": "status", "data": {"status": {"exec_info": {"queue_remaining": 0}}, "sid": sid}})
        try:
            async for _ in ws:
                pass
        finally:
            self._sockets.pop(sid, None)
        return ws

    # --- the queue's one worker ------------------------------------------------------------------
    async def _work(self) -> None:
        """Run accepted prompts one at a time, lowest number first, whatever became of their clients."""
        while True:
            while not self._pending:
                self._work_arrived.clear()
                await self._work_arrived.wait()
            job = min(self._pending, key=lambda queued: queued.number)
            self._pending.remove(job)
            await self._run(job)

    async def _run(self, job: _Job) -> None:
        script, workflow, client_id = self.script, job.workflow, job.client_id
        messages: list[list[Any]] = []  # what history keeps under status.messages

        async def send(kind: str, data: dict[str, Any], *, keep: bool = False) -> None:
            data = {**data, "prompt_id": job.prompt_id}
            if keep:
                messages.append([kind, {**data, "timestamp": int(time.time() * 1000)}])
            await self._send(client_id, {"type": kind, "data": data})

        def finish(outputs: dict[str, Any], *, ok: bool) -> None:
            self.successes[job.prompt_id] += ok
            self.history[job.prompt_id] = {
                "prompt": job.listed(),
                "outputs": outputs,
                "status": {"status_str": "success" if ok else "error", "completed": ok, "messages": messages},
                "meta": {node: {"node_id": node, "display_node": node} for node in outputs},
            }

        self._running = job
        self.executions[job.prompt_id] += 1
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
                    await send(
                        "execution_error",
                        {
                            "node_id": sampler,
                            "node_type": workflow[sampler]["class_type"],
                            "executed": [],
                            "exception_message": "Allocation on device \n",
                            "exception_type": "torch.OutOfMemoryError",
                            "traceback": ['  File "execution.py", line 1, in execute\n'],
                            "current_inputs": {},
                            "current_outputs": {},
                        },
                        keep=True,
                    )
                    finish({}, ok=False)
                    break
            else:
                saved = {
                    "images": [{"filename": script.filename, "subfolder": script.subfolder, "type": "output"}],
                    "animated": [True],
                }
                outputs = dict.fromkeys(_saving_nodes(workflow), saved)
                for node, output in outputs.items():
                    await send("executed", {"node": node, "display_node": node, "output": output})
                await send("execution_success", {}, keep=True)
                await asyncio.sleep(script.step_seconds)  # a real server writes history after this message
                finish(outputs, ok=True)
        finally:
            self._running = None  # history is written before the prompt leaves the queue, as on the real server
        await send("executing", {"node": None})

    def _receivers(self, client_id: str | None) -> list[web.WebSocketResponse]:
        """A prompt's events go to its submitter's session, or to every session if it named none."""
        sockets = list(self._sockets.values()) if client_id is None else [self._sockets.get(client_id)]
        return [ws for ws in sockets if ws is not None and not ws.closed]

    async def _send(self, client_id: str | None, message: dict[str, Any]) -> None:
        for ws in self._receivers(client_id):
            await ws.send_json(message)

    async def _send_bytes(self, client_id: str | None, data: bytes) -> None:
        for ws in self._receivers(client_id):
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
            "type": "prompt_outputs_failed_validation",
            "message": "Prompt outputs failed validation",
            "details": "",
            "extra_info": {},
        },
        "node_errors": {
            node: {
                "errors": [
                    {
                        "type": "required_input_missing",
                        "message": "Required input is missing",
                        "details": "value",
                        "extra_info": {"input_name": "value"},
                    }
                ],
                "dependent_outputs": _saving_nodes(workflow),
                "class_type": workflow[node]["class_type"],
            }
        },
    }
