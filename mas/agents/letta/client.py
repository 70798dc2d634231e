"""The letta-client `Letta` for the configured server, and the translation of its exceptions into ours.

letta-client is an optional install (`pip install 'mas[letta]'`), so it is imported on first use. The
token is sent as a bearer token and never appears in an error message.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from mas.agents.letta.errors import LettaMisconfigured, LettaNotFound, LettaRejected, LettaUnavailable
from mas.config import Settings
from mas.singletons import per_process

ADMIN_TIMEOUT_S = 60.0
"""Longest a lookup, create or update may take."""

STATUS_DETAIL_CHARS = 300
"""How much of the server's explanation of a refused request an error message quotes."""


def letta_client_module():
    """The letta-client package, or a clear error saying how to install it."""
    try:
        import letta_client
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise LettaMisconfigured("the letta backend needs letta-client: pip install 'mas[letta]'") from exc
    return letta_client


def _client_key(settings: Settings) -> tuple[str, str]:
    token = settings.letta.token.get_secret_value() if settings.letta.token else ""
    return settings.letta.url, hashlib.sha256(token.encode()).hexdigest()


@per_process(key=_client_key)
def client(settings: Settings) -> Any:
    """A letta-client `Letta` for MAS_LETTA_URL and MAS_LETTA_TOKEN, one per process."""
    token = settings.letta.token.get_secret_value() if settings.letta.token else ""
    return letta_client_module().Letta(
        base_url=settings.letta.url, api_key=token or None, timeout=ADMIN_TIMEOUT_S, max_retries=2
    )


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Turn letta-client exceptions raised in the block into ours, saying `what` was being done."""
    api = letta_client_module()
    try:
        yield
    except (api.APIConnectionError, api.APITimeoutError) as exc:  # APITimeoutError is a connection error
        raise LettaUnavailable(f"{what}: Letta server unreachable or too slow ({type(exc).__name__})") from exc
    except api.APIStatusError as exc:
        code = exc.status_code
        detail = _status_detail(exc)
        if code in (401, 403):
            raise LettaMisconfigured(
                f"{what}: the Letta server refused the token (HTTP {code}); check MAS_LETTA_TOKEN"
            ) from exc
        if code in (408, 409, 429) or code >= 500:
            raise LettaUnavailable(f"{what}: Letta answered HTTP {code}: {detail}") from exc
        if code == 404:
            raise LettaNotFound(f"{what}: Letta answered HTTP {code}: {detail}") from exc
        raise LettaRejected(f"{what}: Letta answered HTTP {code}: {detail}") from exc


def _status_detail(exc: Exception) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict) and body.get("detail"):
        return str(body["detail"])[:STATUS_DETAIL_CHARS]
    return str(exc)[:STATUS_DETAIL_CHARS]
