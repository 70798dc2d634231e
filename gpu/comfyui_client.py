"""ComfyUI's HTTP and websocket API, as the studio uses it: submit, follow, fetch, stop, free, health.

A render submits an API-format workflow (POST /prompt), follows it over the websocket /ws, falling back to
polling GET /history/{id} when the websocket can't be had or drops, and the caller fetches the output file
from GET /view. File names the server reports are only ever sent back to it as query parameters, never
used as local paths. Connection errors and HTTP 5xx are retried with exponential backoff.

Stopping a render. A render that outlives its timeout is removed from ComfyUI's queue and interrupted, and
so is one left by any exception that is not ComfyUI's own (Celery's SoftTimeLimitExceeded, SystemExit,
KeyboardInterrupt), so the GPU does not go on rendering a video nobody will collect. Code running
elsewhere (another thread, a signal handler) calls `interrupt()`, which stops the render in flight and
makes `render` raise.

Errors, by what trying again can do: a server that does not answer (`ComfyUIUnavailable`) or a render
that ran out of time (`ComfyUITimeout`, queue waits included) may go through later; so may a render that
failed on the server (`ComfyUIRenderFailed`): what fails there is mostly the moment (out of GPU memory
while another process holds it, an interrupt from another client, a restart), since the server checks a
workflow's nodes, inputs and models when it is submitted, and the step's retries are few. A refused
workflow (`ComfyUIRejected`) and an answer that is not ComfyUI's (`ComfyUIBadReply`) fail the same way
every time.
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
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import httpx
from websockets.exceptions import ConnectionClosed, WebSocketException
from websockets.sync.client import ClientConnection, connect

from gpu.interfaces import Progress
from mas.errors import InvalidSettings, PermanentError, PeerUnavailable, RetryableError, StudioError

log = logging.getLogger(__name__)

T = TypeVar("T")


class ComfyUIError(StudioError):
    """Talking to ComfyUI went wrong; the message says what to do about it."""


class ComfyUIRejected(ComfyUIError, InvalidSettings):
    """The server refused the workflow (HTTP 400): MAS_COMFYUI_WORKFLOW does not fit this server's nodes
    and models, and sending the same workflow again cannot help."""

    def __init__(self, message: str, *, node_errors: dict[str, Any]):
        super().__init__(message)
        self.node_errors = node_errors


class ComfyUIUnavailable(ComfyUIError, PeerUnavailable):
    """The server did not answer, or answered 5xx, on every try."""


class ComfyUIRenderFailed(ComfyUIError, RetryableError):
    """The server ran the workflow and a node failed, or the render was interrupted (see the module
    docstring for why a later try can succeed)."""

    def __init__(self, message: str, *, node_id: str | None = None):
        super().__init__(message)
        self.node_id = node_id


class ComfyUITimeout(ComfyUIError, RetryableError, TimeoutError):
    """The render outlived its timeout and was stopped on the server."""


class ComfyUIBadReply(ComfyUIError, PermanentError):
    """The server answered, but not as ComfyUI does: MAS_COMFYUI_URL names something else, or a file the
    server reported cannot be fetched."""


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
    def render(self, workflow: dict[str, Any], *, progress: Progress | None, timeout: float) -> dict[str, Any]:
        """Run `workflow` to a successful end and return its /history entry (outputs and status)."""
        deadline = time.monotonic() + timeout
        with self._events() as events:  # opened before submitting, so no event of this prompt is missed
            prompt_id = self.submit(workflow)
            self.prompt_id = prompt_id
            try:
                if events is not None:
                    self._follow(events, prompt_id, progress, deadline, timeout)
                return _succeeded(self._await_history(prompt_id, deadline, timeout))
            except BaseException as exc:
                if isinstance(exc, ComfyUITimeout) or not isinstance(exc, ComfyUIError):
                    self.cancel(prompt_id)
                raise
            finally:
                self.prompt_id = None

    def submit(self, workflow: dict[str, Any]) -> str:
        """Queue `workflow`; its id. A 400 (the server's validation failed) raises ComfyUIRejected."""
        response = self._request("POST", "/prompt", body={"prompt": workflow, "client_id": self.client_id})
        if response.status_code == 400:
            raise _rejected(_json_or_none(response) or {})
        body = self._json(response, "POST /prompt")
        if body.get("node_errors"):
            log.warning("ComfyUI queued the workflow without some outputs: %s", _node_errors(body["node_errors"]))
        return str(body["prompt_id"])

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
                with os.fdopen(fd, "wb") as sink, httpx.stream(
                    "GET", self.url + "/view", params=params, timeout=self.request_seconds
                ) as response:
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
        """Take the prompt off the queue if it is pending, and interrupt it if it is running (best effort)."""
        for path, body in (("/queue", {"delete": [prompt_id]}), ("/interrupt", {"prompt_id": prompt_id})):
            try:
                self._request("POST", path, body=body, retries=0).raise_for_status()
            except (ComfyUIError, httpx.HTTPError) as exc:
                log.warning("could not stop ComfyUI prompt %s (POST %s): %s", prompt_id, path, exc)

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
    def _events(self) -> Iterator[ClientConnection | None]:
        """The websocket of this client's events, or None (then the render polls /history)."""
        parts = urlsplit(self.url)
        scheme = "wss" if parts.scheme == "https" else "ws"
        url = urlunsplit((scheme, parts.netloc, parts.path + "/ws", f"clientId={self.client_id}", ""))
        try:
            connection = connect(url, open_timeout=self.request_seconds, max_size=1 << 24)
        except (OSError, WebSocketException) as exc:
            log.warning("no websocket from ComfyUI at %s (%s); polling /history instead", self.url, exc)
            yield None
            return
        with connection:
            yield connection

    def _follow(
        self, events: ClientConnection, prompt_id: str, progress: Progress | None, deadline: float, timeout: float
    ) -> None:
        """Relay progress until the websocket says the prompt ended; return early if the socket drops."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._timed_out(prompt_id, timeout)
            try:
                message = events.recv(timeout=min(remaining, self.poll_seconds))
            except TimeoutError:
                if self.history(prompt_id) is not None:  # ended while the socket was quiet
                    return
                continue
            except ConnectionClosed as exc:
                log.warning("ComfyUI websocket closed (%s); polling /history for prompt %s", exc, prompt_id)
                return
            if isinstance(message, bytes):
                continue  # preview frames
            event = json.loads(message)
            kind, data = event.get("type"), event.get("data") or {}
            if data.get("prompt_id") != prompt_id:
                continue
            if kind == "progress" and progress is not None:
                progress(int(data["value"]), int(data["max"]))
            elif kind == "execution_error":
                raise _execution_error(data)
            elif kind == "execution_interrupted":
                raise _interrupted(data)
            elif kind == "executing" and data.get("node") is None:
                return  # sent after the history entry is written (execution_success comes before it)

    def _await_history(self, prompt_id: str, deadline: float, timeout: float) -> dict[str, Any]:
        while (entry := self.history(prompt_id)) is None:
            if time.monotonic() + self.poll_seconds > deadline:
                raise self._timed_out(prompt_id, timeout)
            time.sleep(self.poll_seconds)
        return entry

    def _timed_out(self, prompt_id: str, timeout: float) -> ComfyUITimeout:
        return ComfyUITimeout(
            f"ComfyUI prompt {prompt_id} ran past {timeout:g} s and was stopped; raise MAS_MAX_RENDER_SECONDS "
            f"if renders this long are expected"
        )

    def _request(
        self, method: str, path: str, *, body: Any = None, retries: int | None = None
    ) -> httpx.Response:
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


def _node_errors(node_errors: dict[str, Any]) -> str:
    lines = []
    for node_id, info in node_errors.items():
        for error in info.get("errors", []):
            details = error.get("details")
            lines.append(
                f"node {node_id} ({info.get('class_type', '?')}): "
                f"{f'{details}: ' if details else ''}{error.get('message', error.get('type', 'invalid'))}"
            )
    return "; ".join(lines)


def _rejected(body: dict[str, Any]) -> ComfyUIRejected:
    error = body.get("error") or {}
    if isinstance(error, str):
        error = {"message": error}
    summary = ": ".join(str(part) for part in (error.get("type"), error.get("message")) if part)
    if error.get("details"):
        summary += f" ({error['details']})"
    node_errors = body.get("node_errors") or {}
    nodes = _node_errors(node_errors)
    return ComfyUIRejected(
        f"ComfyUI rejected the workflow ({summary or 'no reason given'})"
        f"{': ' + nodes if nodes else ''}; check MAS_COMFYUI_WORKFLOW against this server's nodes and models",
        node_errors=node_errors,
    )


def _execution_error(data: dict[str, Any]) -> ComfyUIRenderFailed:
    node = data.get("node_id")
    kind = data.get("exception_type") or "error"
    message = str(data.get("exception_message") or "").strip()
    return ComfyUIRenderFailed(
        f"ComfyUI failed at node {node} ({data.get('node_type', '?')}): {kind}: {message}", node_id=node
    )


def _interrupted(data: dict[str, Any]) -> ComfyUIRenderFailed:
    node = data.get("node_id")
    return ComfyUIRenderFailed(
        f"ComfyUI prompt {data.get('prompt_id')} was interrupted at node {node} ({data.get('node_type', '?')})",
        node_id=node,
    )


def _succeeded(entry: dict[str, Any]) -> dict[str, Any]:
    """The /history entry of a render that ended well; ComfyUIRenderFailed with the server's reason if not."""
    status = entry.get("status") or {}
    if status.get("status_str") == "error" or status.get("completed") is False:
        for kind, data in status.get("messages") or []:
            if kind == "execution_error":
                raise _execution_error(data)
            if kind == "execution_interrupted":
                raise _interrupted(data)
        raise ComfyUIRenderFailed(f"ComfyUI reports the render as {status.get('status_str', 'unfinished')}")
    return entry
