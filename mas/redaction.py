"""Secrets kept out of everything the studio shows or keeps: command output, errors, logs, stored failure
reasons, the gallery.

One helper for every URL and secret. It hides a password in a URL's user-info part (whatever characters
the password holds: everything up to the last `@` of the URL counts as user-info; in a list of URLs such as
`sentinel://:pw@h1;sentinel://:pw@h2`, of each), the values of query
parameters that carry credentials (`password=`, `token=`, `api_key=` ...), user-info that is a bare token
(`https://TOKEN@host`), and, in free text, every URL found in it and every known secret value. It never
parses a URL in a way that can fail: a URL that does not parse is redacted the same way.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

HIDDEN = "***"

SECRET_PARAMS = re.compile(
    r"(?i)password|passwd|secret|token|api[_-]?key|signature|credential|^pwd$|^pass$|^key$|^auth|^sig$|^session"
)
URL = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^\s'\"<>]+)")
NEXT_URL = re.compile(r"(?i);(?=[a-z][a-z0-9+.-]*://)")
"""Where one URL of a list ends and the next begins (`sentinel://...;sentinel://...`)."""


def redact_url(url: str | None) -> str | None:
    """`url` with its password, bare user-info token and credential query values replaced by ***."""
    match = URL.fullmatch(url.strip()) if url else None
    if match is None:
        return url
    scheme, rest = match.groups()
    return scheme + _redact_rest(rest)


def _redact_rest(rest: str) -> str:
    first, *others = NEXT_URL.split(rest)
    if others:  # a list of URLs: each redacted alone, so every server stays named and every password hidden
        return ";".join([_redact_rest(first), *(redact_url(url) or "" for url in others)])
    at = rest.rfind("@")
    if at >= 0:
        userinfo, rest = rest[:at], rest[at + 1 :]
        user, colon, _ = userinfo.partition(":")
        userinfo = f"{user}:{HIDDEN}" if colon else HIDDEN
        rest = f"{userinfo}@{rest}"
    path, question, query = rest.partition("?")
    if not question:
        return path
    query, hash_, fragment = query.partition("#")
    parts = []
    for part in query.split("&"):
        name, equals, _ = part.partition("=")
        parts.append(f"{name}={HIDDEN}" if equals and SECRET_PARAMS.search(name) else part)
    return f"{path}?{'&'.join(parts)}{hash_}{fragment}"


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every URL in it redacted and every known secret value (at least 4 characters long)
    replaced by ***."""
    for secret in sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True):
        text = text.replace(secret, HIDDEN)
    return URL.sub(lambda m: m.group(1) + _redact_rest(m.group(2)), text)


class RedactingFilter(logging.Filter):
    """A logging filter that redacts a record's message and traceback before any handler writes it."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.secrets = tuple(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            message = str(record.msg)
        record.msg, record.args = redact_text(message, self.secrets), None
        if record.exc_info:
            record.exc_text = redact_text(logging.Formatter().formatException(record.exc_info), self.secrets)
            record.exc_info = None
        return True


def redact_logs(logger: logging.Logger, secrets: Iterable[str] = ()) -> None:
    """Put a RedactingFilter on every handler of `logger` (and of the root logger)."""
    redactor = RedactingFilter(secrets)
    for handler in {*logger.handlers, *logging.getLogger().handlers}:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(redactor)
