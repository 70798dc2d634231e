"""The runtime clients every process shares: one Redis client per process and broker URL."""

from __future__ import annotations

import redis

from mas.config import Settings
from mas.singletons import per_process


@per_process(key=lambda settings: settings.effective_broker_url)
def redis_client(settings: Settings) -> redis.Redis:
    """A Redis client for the broker (one per process and URL, made afresh in a forked child)."""
    if settings.embedded_broker:
        return redis.Redis(unix_socket_path=str(settings.redis_socket))
    return redis.Redis.from_url(settings.effective_broker_url)
