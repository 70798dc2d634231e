"""The runtime clients every process shares: one Redis client per process and broker.

The broker may be one Redis server (`redis://`, `rediss://`, a unix socket) or a master and its replicas watched by
Redis Sentinel (`sentinel://...;sentinel://...` with MAS_REDIS_SENTINEL_MASTER). A Sentinel client asks the
Sentinels which server is the master before each new connection, and drops its connections when the answer
changes, so after a failover its next command goes to the new master; nothing here remembers the old one.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

from mas import urls
from mas.config import Settings
from mas.errors import InvalidSettings
from mas.singletons import per_process

SENTINEL_TIMEOUT_S = 5
"""How long a Sentinel may take to answer (or to accept a connection) before the next one is asked."""


def _resilient(*, tcp: bool) -> dict:
    """A command that meets a lost or stale connection (Redis restarting, a network cut healing, a failover) is
    sent again on a fresh connection for about ten seconds; an idle connection is checked before it is used."""
    options: dict = {
        "retry": Retry(ExponentialBackoff(cap=2, base=0.2), retries=8),
        "retry_on_error": [redis.ConnectionError, redis.TimeoutError],
        "health_check_interval": 10,
    }
    if tcp:
        options.update(socket_keepalive=True, socket_connect_timeout=5)
    return options


def sentinel_connection(settings: Settings) -> dict[str, Any]:
    """How to talk to the Sentinels themselves: their password (MAS_REDIS_SENTINEL_PASSWORD) and timeouts, so a
    Sentinel that is down or cut off is passed over for the next."""
    password = settings.broker.sentinel_password
    return {
        **({"password": password.get_secret_value()} if password else {}),
        "socket_timeout": SENTINEL_TIMEOUT_S,
        "socket_connect_timeout": SENTINEL_TIMEOUT_S,
        "socket_keepalive": True,
    }


def master_name(settings: Settings) -> str:
    """The name the Sentinels know the master by (the settings refuse a sentinel:// URL without it)."""
    name = settings.broker.sentinel_master
    if not name:
        raise InvalidSettings("a sentinel:// URL needs MAS_REDIS_SENTINEL_MASTER")
    return name


def sentinel_options(settings: Settings, url: str) -> dict[str, Any]:
    """The transport options kombu's and Celery's Sentinel transport and result backend need for `url` (none for
    a URL that is not a Sentinel list): the master's name and how to log in to the Sentinels."""
    if not urls.is_sentinel(url):
        return {}
    return {"master_name": master_name(settings), "sentinel_kwargs": sentinel_connection(settings)}


def connect(settings: Settings, url: str, **options: Any) -> redis.Redis:
    """A client of the Redis `url` names: a unix socket (`redis+socket://PATH`), one server (`redis://`), or the
    master of now that the Sentinels of a `sentinel://` list name. `options` are connection options
    (socket timeouts, retry): TCP keepalives are left out for a unix socket."""
    if urls.is_sentinel(url):
        given = urls.sentinels(url)
        sentinel = Sentinel(given.addresses(), sentinel_kwargs=sentinel_connection(settings))
        return sentinel.master_for(
            master_name(settings),
            db=given.db,
            username=given.username,
            password=given.password,
            **options,
        )
    parts = urlsplit(url)
    if parts.scheme in ("redis+socket", "socket"):
        local = {k: v for k, v in options.items() if k not in ("socket_keepalive", "socket_keepalive_options")}
        return redis.Redis(unix_socket_path=parts.path, **local)
    return redis.Redis.from_url(url, **options)


def _key(settings: Settings) -> tuple:
    password = settings.broker.sentinel_password
    return (
        settings.effective_broker_url,
        settings.broker.sentinel_master,
        password.get_secret_value() if password else "",
    )


@per_process(key=_key)
def redis_client(settings: Settings) -> redis.Redis:
    """A Redis client for the broker (one per process and broker, made afresh in a forked child); with Sentinel, a
    client of whichever server is the master now."""
    if settings.embedded_broker:
        return redis.Redis(unix_socket_path=str(settings.redis_socket), **_resilient(tcp=False))
    url = settings.effective_broker_url
    return connect(settings, url, **_resilient(tcp=not url.startswith(("redis+socket", "socket"))))


def redis_master(settings: Settings) -> str | None:
    """`host:port` of the Redis master the Sentinels name now, asked afresh; None when the broker is one server."""
    if not urls.is_sentinel(settings.effective_broker_url):
        return None
    pool = redis_client(settings).connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    host, port = pool.get_master_address()
    return str(urls.Server(host, int(port)))
