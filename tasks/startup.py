"""A worker finds its database when it starts, before it takes any work.

Its main process finds it (the configured server, or the embedded one of this data folder) and brings the schema
up to date; the pool processes it forks inherit what it found. A task's transaction then only opens a session
(`mas.db.session_scope`): no task looks for a server or starts one.
"""

from __future__ import annotations

import logging

from celery.signals import worker_init

from mas import db

log = logging.getLogger(__name__)


@worker_init.connect
def find_the_database(sender, **_) -> None:
    """In the worker's main process, before its pool exists. A database that is found but does not answer yet (a
    restart, a failover) is waited out by the tasks, as any time it goes away."""
    try:
        db.find(sender.app.settings)
    except (db.DatabaseUnavailable, db.DatabaseAway) as exc:
        log.warning("PostgreSQL does not answer yet; the tasks wait for it: %s", exc)
