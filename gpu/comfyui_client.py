"""ComfyUI's HTTP and websocket API, as the studio uses it: submit, find, follow, fetch, stop, free, health.

A render runs under a prompt id the studio chooses (ComfyUI takes a client-chosen `prompt_id` and does not
de-duplicate), so a render started again after a crash first asks the server about that id: a prompt that
ended well is not run again, one running or waiting in the queue is followed to its end, one that failed
or that the server never saw is submitted. A render is followed over the websocket /ws (a followed prompt's
events go to the session of the client that submitted it, which the follower takes over), falling back to
polling GET /history/{id} when the websocket can't be had, drops or goes quiet; the caller fetches the
output file from GET /view. File names the server reports are only ever sent back to it as query
parameters, never used as local paths. Connection errors and HTTP 5xx are retried with exponential backoff.

Stopping a render. `should_stop()` is polled while a render runs; when it answers True the prompt is taken
off the queue (pending) or interrupted (running), by its id, and the render raises `RenderStopped`. A
render that outlives its timeout (`ComfyUITimeout`), or that any exception not ComfyUI's own leaves
(Celery's SoftTimeLimitExceeded, SystemExit, KeyboardInterrupt), is stopped the same way, so the GPU does
not go on rendering a video nobody will collect. Code running elsewhere (another thread, a signal
handler) calls `interrupt()`, which stops the render in flight and makes `render` raise.

The errors are the ComfyUIError family of `gpu.comfyui_errors`.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit, urlunsplit

import httpx
from websockets.exceptions import ConnectionClosed, WebSocketException
from websockets.sync.client import ClientConnection, connect

from gpu.comfyui_errors import (
    ComfyUIBadReply,
    ComfyUIError,
    ComfyUITimeout,
    ComfyUIUnavailable,
    describe_node_errors,
    ended_well,
    execution_error,
    interruption,
    rejection,
    succeeded,
)
from gpu.interfaces import STOP_POLL_SECONDS, Progress, check_stop

log = logging.getLogger(__name__)

T = TypeVar("T")

STOP_ROUNDS = 3
"""How many times a prompt still listed after being stopped is stopped again."""
STOP_SETTLE_SECONDS = 2.0
"""How long a stopped prompt may stay listed before it is stopped again (a node ends its step first)."""
STOP_CHECK_SECONDS = 0.05


@dataclass(frozen=True, kw_only=True)
class Device:
    name: str
    type: str
    vram_total: int
    vram_free: int


@dataclass(frozen=True, kw_only=True)
class Health:
    """What GET /system_stats says: the server's version and its devices' memory, in bytes."""

    version: str
    devices: tuple[Device, ...]


@dataclass(frozen=True, kw_only=True)
class Found:
    """Where the server has a prompt: `ended` (with its /history entry), `running` or `pending` (with the
    client id of the session its events go to) or `unknown`."""

    state: Literal["ended", "running", "pending", "unknown"]
    entry: dict[str, Any] | None = None
    client_id: str | None = None


class ComfyUIClient:
    """ComfyUI's HTTP and websocket API, retrying transient failures (connection errors, HTTP 5xx).

    Each request opens its own connection: the client holds no sockets between renders, and
    `interrupt()` is safe to call from a signal handler or another thread while a request is in flight.
    """

    def __init__(
        self,
        *,
        url: str,
        retries: int = 3,
        backoff_seconds: float = 0.5,
        poll_seconds: float = 2.0,
        request_seconds: float = 30.0,
    ):
        self.url = url.rstrip("/")
        self.retries = retries
        self.backoff_seconds = backoff_seconds
        self.poll_seconds = poll_seconds  # history polling interval, and the websocket's quiet spell
        self.request_seconds = request_seconds
        self.client_id = str(uuid.uuid4())
        self.prompt_id: str | None = None  # the render in flight

    # --- one render ------------------------------------------------------------------------------
    def render(
        self,
        workflow: dict[str, Any],
        *,
        prompt_id: str,
        progress: Progress | None,
        timeout: float,
        should_stop: Callable[[], bool] | None = None,
        number: float | None = None,
        queue_timeout: float = 0.0,
    ) -> dict[str, Any]:
        """Bring prompt `prompt_id` (running `workflow`) to a successful end; its /history entry. `number`
        places a new prompt in the server's queue (lower runs first; None: at the back); it may wait
        `queue_timeout` s to start, then run `timeout` s (from its start, when the websocket reports it)."""
        deadline = time.monotonic() + queue_timeout + timeout
        try:
            check_stop(should_stop, f"ComfyUI prompt {prompt_id}")
            found = self.find(prompt_id)
            if found.entry is not None:
                if ended_well(found.entry):
                    return found.entry  # rendered already: no new render
                self.forget(prompt_id)  # its failed entry would otherwise answer for the new run
            queued = found.state in ("running", "pending")
            # the websocket opens before submitting, so no event of this prompt is missed
            with self._events(found.client_id if queued else None) as events:
                if queued:
                    log.info("following ComfyUI prompt %s (%s), not submitting it again", prompt_id, found.state)
                else:
                    self.submit(workflow, prompt_id=prompt_id, number=number)
                self.prompt_id = prompt_id
                if events is not None:
                    deadline = self._follow(events, prompt_id, progress, deadline, timeout, should_stop)
                return succeeded(self._await_history(prompt_id, deadline, timeout, should_stop))
        except BaseException as exc:
            if isinstance(exc, ComfyUITimeout) or not isinstance(exc, ComfyUIError):
                self.cancel(prompt_id)
            raise
        finally:
            self.prompt_id = None

    def submit(self, workflow: dict[str, Any], *, prompt_id: str, number: float | None = None) -> None:
        """Queue `workflow` as `prompt_id`, at `number` in the queue if given (lower runs first). A 400 (the
        server's validation failed) raises ComfyUIRejected. A try whose answer was lost may have queued
        it, so the server is asked before each try again."""
        body: dict[str, Any] = {"prompt": workflow, "prompt_id": prompt_id, "client_id": self.client_id}
        if number is not None:
            body["number"] = number
        tries = 0

        def send() -> httpx.Response | None:
            nonlocal tries
            tries += 1
            if tries > 1 and self.find(prompt_id).state != "unknown":
                return None
            response = httpx.request("POST", self.url + "/prompt", json=body, timeout=self.request_seconds)
            if response.status_code >= 500:
                response.raise_for_status()
            return response

        response = self._retrying("POST", "/prompt", send)
        if response is None:
            return
        if response.status_code == 400:
            raise rejection(_json_or_none(response) or {})
        reply = self._json(response, "POST /prompt")
        if reply.get("node_errors"):
            log.warning(
                "ComfyUI queued the workflow without some outputs: %s", describe_node_errors(reply["node_errors"])
            )

    def find(self, prompt_id: str) -> Found:
        """Where the server has the prompt. /history, then /queue, then /history again: a prompt that ends
        between the first two answers (the server writes its history before it leaves the queue) is in the
        third, so `unknown` means the server never had it (or restarted since)."""
        if (entry := self.history(prompt_id)) is not None:
            return Found(state="ended", entry=entry)
        if (queued := self._queued(prompt_id)) is not None:
            return queued
        if (entry := self.history(prompt_id)) is not None:
            return Found(state="ended", entry=entry)
        return Found(state="unknown")

    def forget(self, prompt_id: str) -> None:
        """Delete the prompt's /history entry."""
        response = self._request("POST", "/history", body={"delete": [prompt_id]})
        if response.status_code != 200:
            raise ComfyUIBadReply(f"ComfyUI at {self.url} answered HTTP {response.status_code} to POST /history")

    def history(self, prompt_id: str) -> dict[str, Any] | None:
        """The prompt's /history entry, or None while it is queued or running."""
        return self._json(self._request("GET", f"/history/{prompt_id}"), "GET /history").get(prompt_id)

    def download(self, file: dict[str, Any], output: Path) -> Path:
        """Stream a file the server reported into `output`, via a temporary file next to it."""
        params = {
            "filename": str(file["filename"]),
            "subfolder": str(file.get("subfolder", "")),
            "type": str(file.get("type", "output")),
        }
        output.parent.mkdir(parents=True, exist_ok=True)

        def fetch() -> Path:
            fd, partial = tempfile.mkstemp(dir=output.parent, prefix=f".{output.name}.", suffix=".partial")
            try:
                with (
                    os.fdopen(fd, "wb") as sink,
                    httpx.stream("GET", self.url + "/view", params=params, timeout=self.request_seconds) as response,
                ):
                    if response.status_code >= 500:
                        response.read()
                        response.raise_for_status()
                    if response.status_code != 200:
                        raise ComfyUIBadReply(
                            f"ComfyUI at {self.url} answered HTTP {response.status_code} to GET /view for "
                            f"{params}: {response.read()[:300]!r}"
                        )
                    for chunk in response.iter_bytes(1 << 20):
                        sink.write(chunk)
                os.replace(partial, output)
            except BaseException:
                Path(partial).unlink(missing_ok=True)
                raise
            return output

        return self._retrying("GET", "/view", fetch)

    # --- control ---------------------------------------------------------------------------------
    def interrupt(self) -> None:
        """Stop this client's render in flight, if any (its `render` call then raises)."""
        if self.prompt_id is not None:
            self.cancel(self.prompt_id)

    def cancel(self, prompt_id: str) -> None:
        """Take the prompt off the queue if it is pending and interrupt it if it is running (best effort).

        An interrupt that arrives as the server starts the prompt can be lost, so while the prompt is
        still listed a moment later it is stopped again, a few times.
        """
        for _ in range(STOP_ROUNDS):
            for path, body in (("/queue", {"delete": [prompt_id]}), ("/interrupt", {"prompt_id": prompt_id})):
                try:
                    self._request("POST", path, body=body, retries=0).raise_for_status()
                except (ComfyUIError, httpx.HTTPError) as exc:
                    log.warning("could not stop ComfyUI prompt %s (POST %s): %s", prompt_id, path, exc)
                    return
            settle = time.monotonic() + STOP_SETTLE_SECONDS
            try:
                while self._queued(prompt_id) is not None:
                    if time.monotonic() >= settle:
                        break
                    time.sleep(STOP_CHECK_SECONDS)
                else:
                    return
            except ComfyUIError as exc:
                log.warning("could not check that ComfyUI prompt %s stopped: %s", prompt_id, exc)
                return
        log.warning("ComfyUI prompt %s is still queued after %d stops", prompt_id, STOP_ROUNDS)

    def free(self, *, unload_models: bool = True, free_memory: bool = True) -> None:
        """Ask the server to unload its models and free its cache (it answers before memory is freed)."""
        body = {"unload_models": unload_models, "free_memory": free_memory}
        response = self._request("POST", "/free", body=body)
        if response.status_code != 200:
            raise ComfyUIBadReply(f"ComfyUI at {self.url} answered HTTP {response.status_code} to POST /free")

    def health(self) -> Health:
        """The server's version and its devices' total and free VRAM."""
        stats = self._json(self._request("GET", "/system_stats"), "GET /system_stats")
        devices = tuple(
            Device(name=d["name"], type=d["type"], vram_total=int(d["vram_total"]), vram_free=int(d["vram_free"]))
            for d in stats.get("devices", [])
        )
        return Health(version=str(stats.get("system", {}).get("comfyui_version", "unknown")), devices=devices)

    # --- plumbing --------------------------------------------------------------------------------
    @contextmanager
    def _events(self, client_id: str | None = None) -> Iterator[ClientConnection | None]:
        """The websocket of session `client_id` (this client's by default), or None (then the render polls
        /history). The server sends a prompt's events to the session of the client that submitted it, and
        a new connection under that id takes the session over."""
        parts = urlsplit(self.url)
        scheme = "wss" if parts.scheme == "https" else "ws"
        session = f"clientId={client_id or self.client_id}"
        url = urlunsplit((scheme, parts.netloc, parts.path + "/ws", session, ""))
        try:
            connection = connect(url, open_timeout=self.request_seconds, max_size=1 << 24)
        except (OSError, WebSocketException) as exc:
            log.warning("no websocket from ComfyUI at %s (%s); polling /history instead", self.url, exc)
            yield None
            return
        with connection:
            yield connection

    def _follow(
        self,
        events: ClientConnection,
        prompt_id: str,
        progress: Progress | None,
        deadline: float,
        timeout: float,
        should_stop: Callable[[], bool] | None,
    ) -> float:
        """Relay progress until the websocket says the prompt ended; return early if the socket drops.
        Returns the deadline, brought to `timeout` after the prompt's start once the server reports it."""
        quiet_until = time.monotonic() + self.poll_seconds
        while True:
            check_stop(should_stop, f"ComfyUI prompt {prompt_id}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._timed_out(prompt_id, timeout)
            try:
                message = events.recv(timeout=min(remaining, self.poll_seconds, STOP_POLL_SECONDS))
            except TimeoutError:
                if time.monotonic() >= quiet_until:  # quiet: it may have ended, or its events go elsewhere
                    if self.history(prompt_id) is not None:
                        return deadline
                    quiet_until = time.monotonic() + self.poll_seconds
                continue
            except ConnectionClosed as exc:
                log.warning("ComfyUI websocket closed (%s); polling /history for prompt %s", exc, prompt_id)
                return deadline
            quiet_until = time.monotonic() + self.poll_seconds
            if isinstance(message, bytes):
                continue  # preview frames
            event = json.loads(message)
            kind, data = event.get("type"), event.get("data") or {}
            if data.get("prompt_id") != prompt_id:
                continue
            if kind == "execution_start":
                deadline = min(deadline, time.monotonic() + timeout)
            elif kind == "progress" and progress is not None:
                progress(int(data["value"]), int(data["max"]))
            elif kind == "execution_error":
                raise execution_error(data)
            elif kind == "execution_interrupted":
                raise interruption(data)
            elif kind == "executing" and data.get("node") is None:
                return deadline  # sent after the history entry is written (execution_success comes before it)

    def _await_history(
        self, prompt_id: str, deadline: float, timeout: float, should_stop: Callable[[], bool] | None
    ) -> dict[str, Any]:
        while (entry := self.history(prompt_id)) is None:
            if time.monotonic() + self.poll_seconds > deadline:
                raise self._timed_out(prompt_id, timeout)
            wake = time.monotonic() + self.poll_seconds
            while (left := wake - time.monotonic()) > 0:
                check_stop(should_stop, f"ComfyUI prompt {prompt_id}")
                time.sleep(min(left, STOP_POLL_SECONDS))
        return entry

    def _queued(self, prompt_id: str) -> Found | None:
        """The prompt as GET /queue lists it (running or pending, with its submitter's client id), or None."""
        queue = self._json(self._request("GET", "/queue"), "GET /queue")
        places: tuple[tuple[Literal["running", "pending"], str], ...] = (
            ("running", "queue_running"),
            ("pending", "queue_pending"),
        )
        for state, key in places:
            for item in queue.get(key) or []:  # [number, prompt_id, prompt, extra_data, outputs]
                if isinstance(item, list) and len(item) > 1 and item[1] == prompt_id:
                    extra = item[3] if len(item) > 3 and isinstance(item[3], dict) else {}
                    return Found(state=state, client_id=extra.get("client_id"))
        return None

    def _timed_out(self, prompt_id: str, timeout: float) -> ComfyUITimeout:
        return ComfyUITimeout(
            f"ComfyUI prompt {prompt_id} ran past {timeout:g} s and was stopped; raise MAS_MAX_RENDER_SECONDS "
            f"if renders this long are expected"
        )

    def _request(self, method: str, path: str, *, body: Any = None, retries: int | None = None) -> httpx.Response:
        def send() -> httpx.Response:
            response = httpx.request(method, self.url + path, json=body, timeout=self.request_seconds)
            if response.status_code >= 500:
                response.raise_for_status()
            return response

        return self._retrying(method, path, send, retries=retries)

    def _retrying(self, method: str, path: str, attempt: Callable[[], T], *, retries: int | None = None) -> T:
        """`attempt()`, again after connection errors and 5xx answers, with exponential backoff."""
        tries = 1 + (self.retries if retries is None else retries)
        for number in range(tries):
            if number:
                time.sleep(self.backoff_seconds * 2 ** (number - 1))
            try:
                return attempt()
            except httpx.HTTPStatusError as exc:
                body = exc.response.text[:300]
                problem = f"answered HTTP {exc.response.status_code} to {method} {path}"
                advice = f"({body!r}); see the ComfyUI server's log"
            except httpx.TransportError as exc:
                problem = f"did not answer {method} {path}"
                advice = f"({type(exc).__name__}: {exc}): is it running? set MAS_COMFYUI_URL"
        raise ComfyUIUnavailable(f"ComfyUI at {self.url} {problem} on {tries} tries {advice}")

    def _json(self, response: httpx.Response, what: str) -> dict[str, Any]:
        body = _json_or_none(response)
        if response.status_code != 200 or body is None:
            raise ComfyUIBadReply(
                f"ComfyUI at {self.url} answered {what} with HTTP {response.status_code} "
                f"{response.text[:200]!r}: is MAS_COMFYUI_URL a ComfyUI server?"
            )
        return body


def _json_or_none(response: httpx.Response) -> dict[str, Any] | None:
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None
