"""The runtime clients every process shares: one Redis client per process and broker URL."""

from __future__ import annotations

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from mas.config import Settings
from mas.singletons import per_process


def _resilient(*, tcp: bool) -> dict:
    """A command that meets a lost or stale connection (Redis restarting, a network cut healing) is sent
    again on a fresh connection for about ten seconds; an idle connection is checked before it is used."""
    options: dict = {
        "retry": Retry(ExponentialBackoff(cap=2, base=0.2), retries=8),
        "retry_on_error": [redis.ConnectionError, redis.TimeoutError],
        "health_check_interval": 10,
    }
    if tcp:
        options.update(socket_keepalive=True, socket_connect_timeout=5)
    return options


@per_process(key=lambda settings: settings.effective_broker_url)
def redis_client(settings: Settings) -> redis.Redis:
    """A Redis client for the broker (one per process and URL, made afresh in a forked child)."""
    if settings.embedded_broker:
        return redis.Redis(unix_socket_path=str(settings.redis_socket), **_resilient(tcp=False))
    return redis.Redis.from_url(
        settings.effective_broker_url, **_resilient(tcp=not settings.effective_broker_url.startswith("redis+socket"))
    )
