"""A worker started again takes over at once the steps its killed predecessor held.

A step's lease names its worker and process (`mas.pipeline.leases.holder`). A worker that starts under the
same name (a crash and a restart by `mas run`, systemd or compose) knows those processes are gone: it ends
their leases and asks for a reconcile, which re-sends their steps now instead of after the lease expiry
(`MAS_LEASE_EXPIRY_SECONDS`) and the next periodic reconcile.
"""

from __future__ import annotations

import logging
import threading

from celery.signals import worker_ready

from mas import names
from mas.domain.steps import STARTS
from mas.pipeline import leases

log = logging.getLogger(__name__)


def _take_over(app, nodename: str) -> None:
    try:
        videos = leases.take_over_predecessors(app.settings, nodename)
        if videos:
            log.warning("%s took over the steps its previous run left (videos %s)", nodename, sorted(videos))
            app.send_task(names.RECONCILE, priority=STARTS)
    except Exception as exc:  # the periodic reconcile finds them once their leases expire
        log.warning("%s could not take over its previous run's steps: %s", nodename, exc)


@worker_ready.connect
def take_over_on_start(sender=None, **_) -> None:
    """In a thread: the database may be slow to answer, and the worker is ready to take work meanwhile."""
    if sender is None:
        return
    threading.Thread(target=_take_over, args=(sender.app, sender.hostname), name="take-over", daemon=True).start()
