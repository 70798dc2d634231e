"""Which PostgreSQL and Redis the studio uses, and bringing them up: embedded by default, or configured.

With `MAS_DATABASE_URL` / `MAS_BROKER_URL` set nothing is started and `up` only checks that the configured
servers answer (of a primary and its standbys, or of Sentinel-watched Redis servers, the one that leads now,
which `describe` names); otherwise the embedded servers of `mas.runtime.embedded` are started (or found
running) under the data folder. The runtime clients that workers use are in `mas.runtime.clients`.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from mas import urls
from mas.config import Settings
from mas.errors import PermanentError
from mas.redaction import redact_url
from mas.runtime.clients import connect
from mas.runtime.embedded.common import ServiceError, first_line
from mas.runtime.embedded.postgres import postmaster, sqlalchemy_url, start_postgres, stop_postgres
from mas.runtime.embedded.redis import redis_ping, redis_process, redis_workdir, start_redis, stop_redis

__all__ = [
    "DatabaseNotFound",
    "ServiceError",
    "ServiceInfo",
    "database_url",
    "describe",
    "down",
    "found_database_url",
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
    primary: str = ""  # of several servers (a primary and standbys, a Sentinel-watched master), which one leads now


class DatabaseNotFound(PermanentError):
    """A process asked for its database before it found it (`database_url`, when the process starts)."""


_found: dict[str, str] = {}
"""The URL of each database this process found (`database_url`), by `_database_of`: a plain string, so a forked
child (a prefork pool process) inherits it and never looks for the server again."""


def _database_of(settings: Settings) -> str:
    """Which database `settings` names: the configured URL, or the embedded server's data folder."""
    return settings.database.url or str(settings.pgdata)


def database_url(settings: Settings, *, start: bool = True) -> str:
    """Find PostgreSQL, when a process starts or the embedded services come up: the configured URL, or the
    embedded server's (read from its pid file; started if `start`). This process keeps it for `found_database_url`."""
    if settings.database.url:
        url = urls.sqlalchemy_database_url(settings.database.url)
    elif (running := postmaster(settings)) is not None and running.status == "ready":
        url = sqlalchemy_url(running.get_uri())
    elif not start:
        raise ServiceError("the embedded PostgreSQL is not running: run `mas up`")
    else:
        url = start_postgres(settings)
    _found[_database_of(settings)] = url
    return url


def found_database_url(settings: Settings) -> str:
    """The URL `database_url` found in this process (or the process it was forked from), or the configured one as
    it is written: it looks at no pid file and starts nothing, so opening a transaction never does."""
    if settings.database.url:
        return urls.sqlalchemy_database_url(settings.database.url)
    try:
        return _found[_database_of(settings)]
    except KeyError:
        raise DatabaseNotFound(
            "this process has not found its database: a process finds it when it starts (`mas.db.find`)"
        ) from None


def _external_postgres(settings: Settings) -> tuple[str, str | None]:
    """(`host:port` of the configured PostgreSQL's primary, None) when it answers, else ("", why not): of
    several servers, the one that takes writes now."""
    import psycopg

    try:
        url = urls.libpq_database_url(settings.database.url or "")
        with psycopg.connect(url, connect_timeout=5, target_session_attrs="read-write") as conn:
            return str(urls.Server(conn.info.host, conn.info.port)), None
    except (psycopg.Error, ValueError) as exc:
        return "", first_line(exc)


def _external_postgres_error(settings: Settings) -> str | None:
    """None when the configured PostgreSQL answers, else why not (one line)."""
    return _external_postgres(settings)[1]


def _external_redis(settings: Settings, url: str, timeout: float = 5) -> redis.Redis:
    """A client that tries once: a check, not a worker's client (`mas.runtime.clients.redis_client`)."""
    return connect(settings, url, socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0))


def _external_redis_state(settings: Settings) -> tuple[str, str | None]:
    """(the master's `host:port` when Sentinels name it, else "", None) when the configured Redis answers, else
    ("", why not) in one line."""
    try:
        client = _external_redis(settings, settings.broker.url or "")
        try:
            client.ping()
            pool = client.connection_pool
            master = pool.get_master_address() if hasattr(pool, "get_master_address") else None
        finally:
            client.close()
        return (str(urls.Server(master[0], int(master[1]))) if master else ""), None
    except (redis.RedisError, OSError, ValueError) as exc:
        return "", first_line(exc)


def _external_redis_error(settings: Settings) -> str | None:
    """None when the configured Redis answers, else why not (one line)."""
    return _external_redis_state(settings)[1]


def up(settings: Settings) -> None:
    """Make sure every configured service answers; start the embedded ones.

    Configured (external) servers are checked first, so a wrong URL starts nothing.
    """
    if not settings.embedded_database and (why := _external_postgres_error(settings)):
        raise ServiceError(f"cannot reach PostgreSQL at {redact_url(settings.database.url)}: {why}")
    if not settings.embedded_broker and (why := _external_redis_error(settings)):
        raise ServiceError(f"cannot reach Redis at {redact_url(settings.broker.url)}: {why}")
    database_url(settings)  # the embedded one started; either found for this process
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
        primary, why = _external_postgres(settings)
        infos.append(
            ServiceInfo(
                name="postgres",
                mode="external",
                url=redact_url(settings.database.url) or "",
                running=why is None,
                primary=primary if len(urls.database_servers(settings.database.url or "")) > 1 else "",
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
        master, why = _external_redis_state(settings)
        infos.append(
            ServiceInfo(
                name="redis",
                mode="external",
                url=redact_url(settings.broker.url) or "",
                running=why is None,
                primary=master,
            )
        )
    return infos
