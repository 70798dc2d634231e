"""Engine, sessions and schema migrations.

A process finds its database once, when it starts (`find`: a command, a worker, the gallery), and brings the
schema up to date with Alembic then, under a PostgreSQL advisory lock so several workers starting at once
migrate exactly once; a session opens on what was found.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

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

SCHEMA_REVISION = "0015"
"""The newest migration. A process that finds the database there skips alembic: importing it and reading every
migration cost each new process (a command, a pool process) about half a second of a core. Raise it with each
new migration; a fast-tier test holds it to alembic's head."""

MAX_ROW_ID = 2**31 - 1
"""The largest id a table's key (a PostgreSQL integer) can hold."""


def is_row_id(value: int) -> bool:
    """Whether `value` can be a row's id (keys count from 1): any other id a client sends is simply not found,
    asked of no database (where one out of the column's range would be an error, not an answer)."""
    return 0 < value <= MAX_ROW_ID


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


def find(settings: Settings, *, start: bool = True) -> sa.Engine:
    """Find the database when a process starts (a worker, a command, the gallery): the configured one, or the
    embedded server (started if `start`); check it answers and bring its schema up to date. Every later
    `ready_engine` and `session_scope` of this process, and of the pool processes it forks, uses what was
    found here."""
    return _migrated(_engine(services.database_url(settings, start=start), settings.database.keepalive_seconds))


def ready_engine(settings: Settings) -> sa.Engine:
    """The engine of the database this process found when it started (`find`), one per process and address. It
    looks for no server: a process that never found its database gets `DatabaseNotFound`. A configured URL may
    name a primary and its standbys (`mas.urls`): the engine's connections go to whichever is the primary."""
    return _engine(services.found_database_url(settings), settings.database.keepalive_seconds)


def primary(settings: Settings) -> str | None:
    """`host:port` of the server this process's connections reach now, when the database URL names several (a
    primary and its standbys: the primary); None for one server."""
    if len(urls.database_servers(settings.database.url or "")) < 2:
        return None
    with ready_engine(settings).connect() as conn:
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
    """A transaction on the database this process found at start: committed on success, rolled back on any
    error. It only opens a session: it never looks for the server or starts one."""
    maker = sessionmaker(bind=ready_engine(settings), expire_on_commit=False)
    with maker.begin() as session:
        yield session


def rows_changed(session: Session, statement: sa.Executable) -> int:
    """How many rows an UPDATE or DELETE changed (the guard of a conditional move)."""
    return cast(sa.CursorResult, session.execute(statement)).rowcount


READABLE_TIMES = (datetime(1, 1, 2, tzinfo=UTC), datetime(9999, 12, 30, tzinfo=UTC))
"""The times Python holds, a day inside either end: PostgreSQL keeps others (4713 BC to 294276 AD)."""


def readable(
    column: sa.ColumnElement[datetime] | sa.orm.InstrumentedAttribute[Any],
) -> sa.ColumnElement[datetime | None]:
    """`column` where Python can hold it, else NULL: a listing shows such a row (as its text) instead of failing on
    it ("timestamp too small")."""
    return sa.case((column.between(*READABLE_TIMES), column), else_=sa.null())
