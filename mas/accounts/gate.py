"""The gate in front of every page and API route: the Host header, requests sent from another site's page,
and the credential, which decides who acts (`mas.domain.identity.Identity`, kept in the request's scope).

It lives with the accounts it checks, below the gallery and the API that it guards. Credentials, in order: the
operator's `MAS_API_TOKEN` (an admin, as the operator `mas serve` names: `--user` / MAS_USER), a user's API key
(`Authorization: Bearer mas_...`), the configured gallery login (MAS_GALLERY_USER, an admin as today), a
user's own gallery login (`mas users password`). A studio with none of these configured and no users is
open (it serves only loopback then) and everyone acts as its operator. A login's failures are counted per user
name and per client address (`mas.accounts.throttle`): past their limits a login is refused with 429 and
Retry-After before its password is checked.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from urllib.parse import urlsplit

import anyio.to_thread
import sqlalchemy as sa
from starlette.datastructures import Headers
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from mas.accounts import throttle, users
from mas.config import Settings
from mas.db import DatabaseUnavailable
from mas.domain.identity import Actor, Identity
from mas.errors import InvalidSettings
from mas.runtime.failover import away_message

SCOPE_KEY = "mas.identity"
"""Where the gate keeps the proven `Identity` in a request's scope (read by `mas.api.callers.identity_of`)."""

OPEN_PATHS = frozenset({"/healthz", "/readyz"})
"""Probes answer without credentials (they tell whether the studio works, not what it holds)."""


class GalleryError(InvalidSettings, ValueError):
    """The gallery can't start as configured; the message says what to set."""


def configured_login(settings: Settings) -> tuple[str, str] | None:
    """(user, password) when the gallery's own login is configured, None when not; half a pair is an error."""
    user = settings.service.gallery_user or ""
    password = settings.service.gallery_password.get_secret_value() if settings.service.gallery_password else ""
    if bool(user) != bool(password):
        raise GalleryError("set both MAS_GALLERY_USER and MAS_GALLERY_PASSWORD, or neither")
    return (user, password) if user else None


class Gate:
    """Refuses a request before any route runs (a Host header not allowed, a cross-site write, a missing or
    wrong credential) and otherwise records who it is from."""

    def __init__(self, app: ASGIApp, *, settings: Settings, hosts: frozenset[str] | None, operator: Actor) -> None:
        self.app = app
        self.settings = settings
        self.operator = operator
        login = configured_login(settings)
        self.login = None if login is None else (login[0].encode(), login[1].encode())
        self.token = settings.service.api_token.get_secret_value().encode() if settings.service.api_token else None
        self.hosts = hosts
        self.verified: set[str] = set()  # logins already checked against their scrypt hash

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers, path = Headers(scope=scope), scope.get("path", "")
        refusal = _refusal(headers, path, scope.get("method", "GET"), self.hosts)
        if refusal is None and path not in OPEN_PATHS:
            client = scope.get("client")
            address = client[0] if client else ""
            try:
                identity = await anyio.to_thread.run_sync(self._identity, headers.get("authorization", ""), address)
            except DatabaseUnavailable as exc:
                refusal = _unavailable(path, str(exc))
            except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:  # restarting or failing over
                refusal = _unavailable(path, away_message(self.settings.database.url, exc))
            except throttle.TooManyLogins as exc:
                refusal = _throttled(path, exc)
            else:
                if identity is None:
                    refusal = _unauthorized(path)
                scope[SCOPE_KEY] = identity
        if refusal is None:
            await self.app(scope, receive, send)
        else:
            await refusal(scope, receive, send)

    def _identity(self, authorization: str, address: str) -> Identity | None:
        """Who the credential proves, or None. A login (basic auth) is throttled before its password is checked,
        and a failed one counted (`mas.accounts.throttle`)."""
        scheme, _, given = authorization.partition(" ")
        given = given.strip()
        if scheme.lower() == "bearer" and given:
            if self.token is not None and secrets.compare_digest(given.encode(), self.token):
                return self._operator()
            found = users.by_key(self.settings, given)
            if found is not None:
                return found
        login = _basic_credentials(authorization) if scheme.lower() == "basic" else None
        if login is not None:
            name, password = login[0].decode(errors="replace"), login[1].decode(errors="replace")
            throttle.check(self.settings, name, address)
            if self.login is not None and _same_login(login, self.login):
                return Identity(name=name, role="admin")
            found = users.by_login(self.settings, name, password, self.verified)
            if found is not None:
                return found
        if self.login is None and self.token is None and not users.any_users(self.settings):
            return self._operator()  # an open studio (served on loopback only)
        if login is not None:
            throttle.failed(self.settings, name, address)
        return None

    def _operator(self) -> Identity:
        return Identity(name=self.operator.user, role="admin")


def _refusal(headers: Headers, path: str, method: str, hosts: frozenset[str] | None) -> Response | None:
    if hosts is not None and _hostname(headers.get("host", "")) not in hosts:
        return PlainTextResponse("this gallery only answers to its loopback host names", status_code=400)
    if method != "GET" and path.startswith("/api/") and _cross_site(headers):
        return _problem(
            403, "cross-site", "Forbidden", "a request sent from another site's page was refused; nothing changed"
        )
    return None


def _problem(status: int, kind: str, title: str, detail: str, headers: dict[str, str] | None = None) -> Response:
    body = {
        "type": f"urn:mas:problem:{kind}",
        "title": title,
        "status": status,
        "detail": detail,
        "retryable": status in (429, 503),
    }
    return JSONResponse(body, status_code=status, media_type="application/problem+json", headers=headers)


def _unauthorized(path: str) -> Response:
    if path.startswith("/api/"):
        challenge = 'Bearer realm="mas", Basic realm="mas gallery", charset="UTF-8"'
        detail = "the studio needs a credential (an API key, or basic auth); a revoked or expired key is refused"
        return _problem(401, "unauthorized", "Unauthorized", detail, {"WWW-Authenticate": challenge})
    return PlainTextResponse(
        "the gallery needs your user name and password",
        status_code=401,
        headers={"WWW-Authenticate": 'Basic realm="mas gallery", charset="UTF-8"'},
    )


def _throttled(path: str, exc: throttle.TooManyLogins) -> Response:
    headers = {"Retry-After": str(exc.retry_after)}
    if path.startswith("/api/"):
        return _problem(429, "too-many-logins", "Too many requests", str(exc), headers)
    return PlainTextResponse(str(exc), status_code=429, headers=headers)


def _unavailable(path: str, detail: str) -> Response:
    if path.startswith("/api/"):
        return _problem(503, "unavailable", "Unavailable", detail, {"Retry-After": "5"})
    return PlainTextResponse(detail, status_code=503, headers={"Retry-After": "5"})


def _hostname(host_header: str) -> str | None:
    try:
        return urlsplit("//" + host_header).hostname
    except ValueError:  # e.g. an unclosed IPv6 bracket
        return None


def _cross_site(headers: Headers) -> bool:
    """A page on another site made the browser send this (CSRF): browsers send Origin on such a request."""
    origin = headers.get("origin")
    return origin is not None and urlsplit(origin).netloc != headers.get("host")


def _basic_credentials(header: str) -> tuple[bytes, bytes] | None:
    _, _, encoded = header.partition(" ")
    try:
        name, sep, password = base64.b64decode(encoded.strip(), validate=True).partition(b":")
    except binascii.Error:
        return None
    return (name, password) if sep and name else None


def _same_login(given: tuple[bytes, bytes], login: tuple[bytes, bytes]) -> bool:
    # both compared every time, in constant time, so timing tells nothing about either
    user_ok = secrets.compare_digest(given[0], login[0])
    password_ok = secrets.compare_digest(given[1], login[1])
    return user_ok and password_ok
