"""What a restart or a failover of PostgreSQL looks like to the studio, in one place.

A server that went away (killed, restarting, cut off), a server shutting down or still starting up, and a server
that is no longer the primary (a demoted primary, a standby: "cannot execute INSERT in a read-only transaction")
all mean the same to a caller: this try failed, a later one reaches the primary. So every such error is raised
as `DatabaseAway`: a SQLAlchemy `OperationalError` (every `except OperationalError` goes on treating it as a
lost connection) and a studio `RetryableError`. Its connection is dropped and the engine's pool emptied (the
pool is invalidated: connections made before the error are replaced when next checked out), so no connection to
the old primary is used again; a new connection goes through libpq's host list, whose
`target_session_attrs=read-write` picks the primary of now. `watch(engine)` hooks this on an engine.

Tasks wait out `DATABASE_AWAY` with backed-off retries that never spend a step's own retries
(`mas.runtime.app.StudioTask`); what cannot be sent again cheaply (a finished render's record, a person
watching a batch) waits it out in place, for a bounded time (`waited_out`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import ExceptionContext

from mas.errors import PeerUnavailable, RetryableError
from mas.runtime.embedded.common import first_line

T = TypeVar("T")

FAILING_OVER = "database failing over"
"""What a watcher or a stream says while it waits for the database."""

TRANSIENT_SQLSTATES: dict[str, str] = {
    "25006": "read-only transaction: the server is a standby, or a primary demoted or fenced",
    "57P01": "the server was shut down by its administrator (admin_shutdown)",
    "57P02": "the server crashed and is restarting (crash_shutdown)",
    "57P03": "the server is starting up, shutting down or in recovery (cannot_connect_now)",
    "08000": "connection exception",
    "08001": "the client could not connect",
    "08003": "the connection does not exist",
    "08004": "the server rejected the connection",
    "08006": "the connection failed",
}
"""SQLSTATEs that a restart or a failover causes, with what each means."""


class DatabaseUnavailable(PeerUnavailable):
    """PostgreSQL could not be reached; the message says which URL and what to do."""


class DatabaseAway(sa.exc.OperationalError, RetryableError):
    """PostgreSQL is away, restarting, or not the primary any more (a failover): the connection was dropped and
    the pool emptied; trying again reaches the primary of now."""


DATABASE_AWAY: tuple[type[BaseException], ...] = (sa.exc.OperationalError, sa.exc.InterfaceError, DatabaseUnavailable)
"""PostgreSQL unreachable, restarting, still starting up or failing over: waited out, never a step's failure."""


def away_message(database_url: str | None, exc: BaseException) -> str:
    """What a page or a problem tells a person when PostgreSQL did not answer: which server (its URL, the password
    hidden; or the embedded one) and the driver's first line of why."""
    from mas.redaction import redact_url

    where = redact_url(database_url) if database_url else "the embedded server"
    reason = exc.orig if isinstance(exc, sa.exc.DBAPIError) and exc.orig is not None else exc
    return f"cannot reach PostgreSQL at {where}: {first_line(reason)} (it may be restarting or failing over; try again shortly)"


def sqlstate(exc: BaseException | None) -> str | None:
    """The SQLSTATE of a psycopg error (or of the one a SQLAlchemy error wraps); None when it has none."""
    if isinstance(exc, sa.exc.DBAPIError):
        exc = exc.orig
    return getattr(exc, "sqlstate", None) if isinstance(exc, psycopg.Error) else None


def is_away(exc: BaseException) -> bool:
    """Whether `exc` means the database is away or is not the primary (see the module's docstring)."""
    if isinstance(exc, DatabaseAway | DatabaseUnavailable):
        return True
    if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
        return True
    code = sqlstate(exc)
    if code is not None:
        return code in TRANSIENT_SQLSTATES or code.startswith("08")
    original = exc.orig if isinstance(exc, sa.exc.DBAPIError) else exc
    # no SQLSTATE: psycopg's own "connection failed", "server closed the connection unexpectedly"
    return isinstance(original, psycopg.OperationalError | psycopg.InterfaceError)


def _on_error(context: ExceptionContext) -> BaseException | None:
    """`handle_error`: an error that means the server is away or not the primary drops the connection, empties the
    pool and is raised as `DatabaseAway`; any other error is left as it is."""
    original = context.original_exception
    if not isinstance(original, psycopg.Error) or not (context.is_disconnect or is_away(original)):
        return None
    if context.connection is not None or context.is_pre_ping:
        context.is_disconnect = True  # drop this connection, and the pool's connections made before it
        context.invalidate_pool_on_disconnect = True
    hide = context.engine.hide_parameters if context.engine is not None else False
    return DatabaseAway(
        context.statement,
        context.parameters,
        original,
        hide_parameters=hide,
        connection_invalidated=context.is_disconnect,
    )


def watch(engine: sa.Engine) -> sa.Engine:
    """Raise `DatabaseAway` for every error of `engine` that a restart or a failover causes (the connection
    dropped, the pool emptied)."""
    sa.event.listen(engine, "handle_error", _on_error)
    return engine


def waited_out(
    call: Callable[[], T], *, seconds: float, waiting: Callable[[BaseException, float], None] | None = None
) -> T:
    """`call()`, tried again while the database is away (`DATABASE_AWAY`) for at most `seconds`, backing off from
    a quarter of a second to two: a failover is seconds of errors, not a failure. `waiting(error, seconds_left)`
    hears each error waited out; past `seconds` the last one is raised."""
    deadline, pause = time.monotonic() + seconds, 0.25
    while True:
        try:
            return call()
        except DATABASE_AWAY as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            if waiting is not None:
                waiting(exc, left)
            time.sleep(min(pause, left))
            pause = min(2 * pause, 2.0)
