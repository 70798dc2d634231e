"""The headers every response of the gallery and the API carries, so no other site can frame its buttons
(clickjacking), make a browser guess a type, or read where a person came from.

The pages' one style sheet and one script are inline in `base.html`: the policy allows exactly those (by their
SHA-256, taken from the page as rendered when the app is made, so an edit of either is allowed with it), the
gallery's own videos, frames, API and event stream, and nothing else. The API's reference pages (`/api/v1/docs`,
`/api/v1/redoc`) load their viewer from a CDN with a script of their own: they are only kept from being framed.
"""

from __future__ import annotations

import base64
import hashlib
import re

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REFERENCE_PAGES = ("/api/v1/docs", "/api/v1/redoc")
FRAMING_ONLY = "frame-ancestors 'none'"

ALWAYS = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}


def _hashes(page: str, tag: str) -> str:
    bodies = re.findall(rf"<{tag}>(.*?)</{tag}>", page, flags=re.DOTALL)
    return " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(b.encode()).digest()).decode()}'" for b in bodies)


def page_policy(page: str) -> str:
    """The Content-Security-Policy of the pages whose inline `<style>` and `<script>` are those of `page` (the
    base template, rendered), for every response but the reference pages."""
    return (
        f"default-src 'none'; script-src {_hashes(page, 'script')}; style-src {_hashes(page, 'style')}; "
        f"img-src 'self' data:; media-src 'self'; connect-src 'self'; form-action 'self'; base-uri 'none'; "
        f"{FRAMING_ONLY}"
    )


class SecurityHeaders:
    """Adds the headers to every HTTP response, a refusal by the gate and an event stream included."""

    def __init__(self, app: ASGIApp, *, policy: str) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        csp = FRAMING_ONLY if scope.get("path", "").startswith(REFERENCE_PAGES) else self.policy

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in {**ALWAYS, "Content-Security-Policy": csp}.items():
                    headers.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, send_with_headers)
