"""Engine, sessions and schema migrations.

The schema is applied by Alembic on `mas up` and on first use by any command or worker, under a
PostgreSQL advisory lock so several workers starting at once migrate exactly once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, cast

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from mas import locks, names, urls
from mas.config import Settings
from mas.errors import InvalidSettings
from mas.runtime import failover, services
from mas.runtime.failover import DatabaseAway as DatabaseAway  # re-exported: the studio's database errors
from mas.runtime.failover import DatabaseUnavailable as DatabaseUnavailable
from mas.singletons import per_process

if TYPE_CHECKING:
    from alembic.config import Config

SCHEMA_REVISION = "0013"
"""The newest migration. A process that finds the database there skips alembic: importing it and reading every
migration cost each new process (a command, a pool process) about half a second of a core. Raise it with each
new migration; a fast-tier test holds it to alembic's head."""


def alembic_config(connection: sa.Connection | None = None) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def keepalive_options(seconds: int) -> dict:
    """TCP keepalives on both ends of every connection, so a peer that vanished (a host cut off the network,
    a machine gone) is noticed within about 2.5 x `seconds`: the server then ends that client's session and
    releases its row and advisory locks, which a worker taking over its step would otherwise wait on for
    hours (the kernel's default); and the client drops a connection to a server that went away."""
    interval = max(1, seconds // 2)
    # keepalives cover an idle connection; tcp_user_timeout one whose sent data goes unacknowledged (the
    # peer vanished just as an answer left), where keepalives do not start
    user_timeout_ms = 1000 * (seconds + 3 * interval)
    return {
        "keepalives": 1,
        "keepalives_idle": seconds,
        "keepalives_interval": interval,
        "keepalives_count": 3,
        "tcp_user_timeout": user_timeout_ms,
        "options": f"-c tcp_keepalives_idle={seconds} -c tcp_keepalives_interval={interval} "
        f"-c tcp_keepalives_count=3 -c tcp_user_timeout={user_timeout_ms}",
    }


@per_process(key=lambda url, keepalive_s: (url, keepalive_s))
def _engine(url: str, keepalive_s: int) -> sa.Engine:
    # LIFO: one process doing one thing at a time keeps reusing one warm connection (its prepared
    # statements and plans included) instead of rotating through the pool. An error that a restart or a
    # failover causes drops the connection and empties the pool, and is raised as `DatabaseAway`
    # (`mas.runtime.failover`); the URL names every server, so the engine outlives a failover.
    return failover.watch(
        sa.create_engine(
            url,
            pool_pre_ping=True,
            pool_size=5,
            max_overflow=5,
            pool_use_lifo=True,
            connect_args={"connect_timeout": 5, **keepalive_options(keepalive_s)},
        )
    )


def engine(settings: Settings, *, start: bool = True) -> sa.Engine:
    """The engine for this settings' database (embedded server started if `start`), one per process and
    address: the embedded server's address is asked each time, as a restart may move it. A configured URL may
    name a primary and its standbys (`mas.urls`): the engine's connections go to whichever is the primary."""
    return _engine(services.database_url(settings, start=start), settings.database.keepalive_seconds)


def primary(settings: Settings) -> str | None:
    """`host:port` of the server this process's connections reach now, when the database URL names several (a
    primary and its standbys: the primary); None for one server."""
    if len(urls.database_servers(settings.database.url or "")) < 2:
        return None
    with engine(settings, start=False).connect() as conn:
        info = conn.connection.dbapi_connection.info  # type: ignore[union-attr]
        return str(urls.Server(info.host, info.port))


def check_connection(eng: sa.Engine) -> None:
    try:
        with eng.connect() as conn:
            conn.execute(sa.text("select 1"))
    except sa.exc.OperationalError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise DatabaseUnavailable(
            f"cannot reach PostgreSQL at {eng.url.render_as_string(hide_password=True)}: {reason}"
        ) from exc


class VectorExtensionMissing(InvalidSettings):
    """The database lacks pgvector and the studio's role may not create it (a managed PostgreSQL)."""


def ensure_vector(conn: sa.Connection) -> None:
    """Create pgvector when the role may; otherwise say in one line what a superuser must run.

    pgvector is not a trusted extension: only a superuser creates it, which a managed PostgreSQL's
    login role is not. Where it already exists nothing is asked of the role."""
    if conn.scalar(sa.text("select 1 from pg_extension where extname = 'vector'")):
        return
    try:
        with conn.begin_nested():
            conn.execute(sa.text("CREATE EXTENSION IF NOT EXISTS vector"))
    except sa.exc.ProgrammingError as exc:
        database, role = conn.execute(sa.text("select current_database(), current_user")).one()
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise VectorExtensionMissing(
            f"the database {database!r} has no pgvector extension and the role {role!r} may not create it "
            f"({reason}); as a superuser run: psql -d {database} -c 'CREATE EXTENSION vector;'"
        ) from exc


def migrate(eng: sa.Engine, revision: str = "head") -> None:
    """Bring the schema to `revision` (default: newest), once, whoever else is starting."""
    with eng.begin() as conn:
        locks.acquire(conn, names.MIGRATION_LOCK)
        ensure_vector(conn)
        from alembic import command

        command.upgrade(alembic_config(conn), revision)


def downgrade(eng: sa.Engine, revision: str = "base") -> None:
    with eng.begin() as conn:
        locks.acquire(conn, names.MIGRATION_LOCK)
        from alembic import command

        command.downgrade(alembic_config(conn), revision)


def ready_engine(settings: Settings) -> sa.Engine:
    """An engine whose schema is current: reachable, migrated (once per process)."""
    return _migrated(engine(settings))


@per_process(key=lambda eng: str(eng.url))
def _migrated(eng: sa.Engine) -> sa.Engine:
    check_connection(eng)
    if schema_revision(eng) != SCHEMA_REVISION:
        migrate(eng)
    return eng


def schema_revision(eng: sa.Engine) -> str | None:
    """The migration the database is at; None before the first."""
    with eng.connect() as conn:
        if conn.execute(sa.text("select to_regclass('alembic_version')")).scalar() is None:
            return None
        return conn.execute(sa.text("select version_num from alembic_version")).scalar()


@contextmanager
def session_scope(settings: Settings) -> Iterator[Session]:
    """A transaction: committed on success, rolled back on any error."""
    maker = sessionmaker(bind=ready_engine(settings), expire_on_commit=False)
    with maker.begin() as session:
        yield session


def rows_changed(session: Session, statement: sa.Executable) -> int:
    """How many rows an UPDATE or DELETE changed (the guard of a conditional move)."""
    return cast(sa.CursorResult, session.execute(statement)).rowcount
