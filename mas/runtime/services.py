"""Which PostgreSQL and Redis the studio uses, and bringing them up: embedded by default, or configured.

With `MAS_DATABASE_URL` / `MAS_BROKER_URL` set nothing is started and `up` only checks that the configured
servers answer; otherwise the embedded servers of `mas.runtime.embedded` are started (or found running) under the
data folder. The runtime clients that workers use are in `mas.runtime.clients`.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from mas.config import Settings
from mas.redaction import redact_url
from mas.runtime.embedded.common import ServiceError, first_line
from mas.runtime.embedded.postgres import postmaster, sqlalchemy_url, start_postgres, stop_postgres
from mas.runtime.embedded.redis import redis_ping, redis_process, redis_workdir, start_redis, stop_redis

__all__ = [
    "ServiceError",
    "ServiceInfo",
    "database_url",
    "describe",
    "down",
    "start_postgres",
    "start_redis",
    "stop_postgres",
    "stop_redis",
    "up",
]


@dataclass(frozen=True, kw_only=True)
class ServiceInfo:
    name: str
    mode: str  # "embedded" or "external"
    url: str
    running: bool
    pid: int | None = None
    data: str = ""


def database_url(settings: Settings, *, start: bool = True) -> str:
    """The URL to reach PostgreSQL: the configured one, or the embedded server's (started if needed)."""
    if settings.database.url:
        return sqlalchemy_url(settings.database.url)
    running = postmaster(settings)
    if running is not None and running.status == "ready":
        return sqlalchemy_url(running.get_uri())
    if not start:
        raise ServiceError("the embedded PostgreSQL is not running: run `mas up`")
    return start_postgres(settings)


def _external_postgres_error(settings: Settings) -> str | None:
    """None when the configured PostgreSQL answers, else why not (one line)."""
    import psycopg

    url = (settings.database.url or "").replace("postgresql+psycopg://", "postgresql://", 1)
    try:
        with psycopg.connect(url, connect_timeout=5):
            return None
    except (psycopg.Error, ValueError) as exc:
        return first_line(exc)


def _external_postgres_ok(settings: Settings) -> bool:
    return _external_postgres_error(settings) is None


def _external_redis(url: str, timeout: float = 5) -> redis.Redis:
    parts = urlsplit(url)
    if parts.scheme in ("redis+socket", "socket"):
        return redis.Redis(
            unix_socket_path=parts.path,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
        )
    return redis.Redis.from_url(
        url, socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0)
    )


def _external_redis_error(settings: Settings) -> str | None:
    """None when the configured Redis answers, else why not (one line)."""
    try:
        client = _external_redis(settings.broker.url or "")
        try:
            client.ping()
        finally:
            client.close()
        return None
    except (redis.RedisError, OSError, ValueError) as exc:
        return first_line(exc)


def up(settings: Settings) -> None:
    """Make sure every configured service answers; start the embedded ones.

    Configured (external) servers are checked first, so a wrong URL starts nothing.
    """
    if not settings.embedded_database and (why := _external_postgres_error(settings)):
        raise ServiceError(f"cannot reach PostgreSQL at {redact_url(settings.database.url)}: {why}")
    if not settings.embedded_broker and (why := _external_redis_error(settings)):
        raise ServiceError(f"cannot reach Redis at {redact_url(settings.broker.url)}: {why}")
    if settings.embedded_database:
        start_postgres(settings)
    if settings.embedded_broker:
        start_redis(settings)


def down(settings: Settings) -> list[str]:
    """Stop the embedded services; return the names of those stopped."""
    stopped = []
    if settings.embedded_broker and stop_redis(settings):
        stopped.append("redis")
    if settings.embedded_database and stop_postgres(settings):
        stopped.append("postgres")
    return stopped


def describe(settings: Settings) -> list[ServiceInfo]:
    """What runs where, for `mas services`; starts nothing."""
    infos = []
    if settings.embedded_database:
        pm = postmaster(settings)
        infos.append(
            ServiceInfo(
                name="postgres",
                mode="embedded",
                url=sqlalchemy_url(pm.get_uri()) if pm else "(not running)",
                running=pm is not None,
                pid=pm.pid if pm else None,
                data=str(settings.pgdata),
            )
        )
    else:
        infos.append(
            ServiceInfo(
                name="postgres",
                mode="external",
                url=redact_url(settings.database.url) or "",
                running=_external_postgres_ok(settings),
            )
        )
    if settings.embedded_broker:
        proc = redis_process(settings)
        infos.append(
            ServiceInfo(
                name="redis",
                mode="embedded",
                url=settings.effective_broker_url,
                running=redis_ping(settings),
                pid=proc.pid if proc else None,
                data=str(redis_workdir(settings)),
            )
        )
    else:
        infos.append(
            ServiceInfo(
                name="redis",
                mode="external",
                url=redact_url(settings.broker.url) or "",
                running=_external_redis_error(settings) is None,
            )
        )
    return infos
