"""The ComfyUIError family, and how ComfyUI's error replies (a refused workflow, a failed or interrupted
render) become its members.

Errors, by what trying again can do: a server that does not answer (`ComfyUIUnavailable`) or a render
that ran out of time (`ComfyUITimeout`, queue waits included) may go through later; so may a render that
failed on the server (`ComfyUIRenderFailed`): what fails there is mostly the moment (out of GPU memory
while another process holds it, an interrupt from another client, a restart), since the server checks a
workflow's nodes, inputs and models when it is submitted, and the step's retries are few. A refused
workflow (`ComfyUIRejected`) and an answer that is not ComfyUI's (`ComfyUIBadReply`) fail the same way
every time.
"""

from __future__ import annotations

from typing import Any

from mas.errors import InvalidSettings, PeerUnavailable, PermanentError, RetryableError, StudioError


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


def describe_node_errors(node_errors: dict[str, Any]) -> str:
    """The server's per-node validation errors, one clause per error."""
    lines = []
    for node_id, info in node_errors.items():
        for error in info.get("errors", []):
            details = error.get("details")
            lines.append(
                f"node {node_id} ({info.get('class_type', '?')}): "
                f"{f'{details}: ' if details else ''}{error.get('message', error.get('type', 'invalid'))}"
            )
    return "; ".join(lines)


def rejection(body: dict[str, Any]) -> ComfyUIRejected:
    """The error for a 400 answer to POST /prompt."""
    error = body.get("error") or {}
    if isinstance(error, str):
        error = {"message": error}
    summary = ": ".join(str(part) for part in (error.get("type"), error.get("message")) if part)
    if error.get("details"):
        summary += f" ({error['details']})"
    node_errors = body.get("node_errors") or {}
    nodes = describe_node_errors(node_errors)
    return ComfyUIRejected(
        f"ComfyUI rejected the workflow ({summary or 'no reason given'})"
        f"{': ' + nodes if nodes else ''}; check MAS_COMFYUI_WORKFLOW against this server's nodes and models",
        node_errors=node_errors,
    )


def execution_error(data: dict[str, Any]) -> ComfyUIRenderFailed:
    """The error for an `execution_error` event or history message."""
    node = data.get("node_id")
    kind = data.get("exception_type") or "error"
    message = str(data.get("exception_message") or "").strip()
    return ComfyUIRenderFailed(
        f"ComfyUI failed at node {node} ({data.get('node_type', '?')}): {kind}: {message}", node_id=node
    )


def interruption(data: dict[str, Any]) -> ComfyUIRenderFailed:
    """The error for an `execution_interrupted` event or history message."""
    node = data.get("node_id")
    return ComfyUIRenderFailed(
        f"ComfyUI prompt {data.get('prompt_id')} was interrupted at node {node} ({data.get('node_type', '?')})",
        node_id=node,
    )


def ended_well(entry: dict[str, Any]) -> bool:
    """Whether a /history entry is that of a render that succeeded."""
    status = entry.get("status") or {}
    return status.get("status_str") != "error" and status.get("completed") is not False


def succeeded(entry: dict[str, Any]) -> dict[str, Any]:
    """The /history entry of a render that ended well; ComfyUIRenderFailed with the server's reason if not."""
    status = entry.get("status") or {}
    if not ended_well(entry):
        for kind, data in status.get("messages") or []:
            if kind == "execution_error":
                raise execution_error(data)
            if kind == "execution_interrupted":
                raise interruption(data)
        raise ComfyUIRenderFailed(f"ComfyUI reports the render as {status.get('status_str', 'unfinished')}")
    return entry
