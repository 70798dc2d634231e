"""Failed logins counted per user name and per client address, in fixed windows kept on Redis (so every `mas
serve` process counts the same): past MAS_LOGIN_FAILURES_PER_USER or MAS_LOGIN_FAILURES_PER_ADDRESS in
MAS_LOGIN_WINDOW_SECONDS, a login is refused before its password is checked. A password's hash is slow on
purpose (scrypt), so this bounds what an unauthenticated client's guesses cost the server, and how many it gets.

An API key needs no throttle: its secret is 256 random bits and checked by one fast hash. While Redis cannot be
reached logins are checked unthrottled (a warning says so): a broker failing over must not lock every person out.
"""

from __future__ import annotations

import logging

import redis

from mas import names
from mas.config import Settings
from mas.errors import RetryableError
from mas.runtime.clients import redis_client

log = logging.getLogger(__name__)


class TooManyLogins(RetryableError):
    """Too many failed logins for this user name or from this address in the current window."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"too many failed logins; try again in {retry_after} s")
        self.retry_after = retry_after


def _keys(user: str, address: str) -> tuple[str, str]:
    return names.login_failures_key("user", user), names.login_failures_key("address", address)


def check(settings: Settings, user: str, address: str) -> None:
    """Raise TooManyLogins (with the seconds until the window ends) when a login as `user` from `address` may not
    be checked now."""
    limits = (settings.service.login_failures_per_user, settings.service.login_failures_per_address)
    try:
        with redis_client(settings).pipeline(transaction=False) as pipe:
            for key in _keys(user, address):
                pipe.get(key)
                pipe.ttl(key)
            replies = pipe.execute()
    except redis.RedisError as exc:
        log.warning("logins are checked unthrottled: Redis cannot be reached (%s)", exc)
        return
    counts, ttls = replies[0::2], replies[1::2]
    waits = [max(ttl, 1) for count, ttl, limit in zip(counts, ttls, limits, strict=True) if int(count or 0) >= limit]
    if waits:
        raise TooManyLogins(max(waits))


def failed(settings: Settings, user: str, address: str) -> None:
    """Count a failed login as `user` from `address` (a window starts with the first failure in it)."""
    window = settings.service.login_window_seconds
    try:
        with redis_client(settings).pipeline(transaction=True) as pipe:
            for key in _keys(user, address):
                pipe.set(key, 0, ex=window, nx=True)
                pipe.incr(key)
            pipe.execute()
    except redis.RedisError as exc:
        log.warning("a failed login was not counted: Redis cannot be reached (%s)", exc)
