"""Upkeep of a gpu host: the partial files of renders whose worker died are removed where they lie.

A render writes into a scratch file named after its lease's key (`*.KEY.partial.*`, in the storage's local
staging folder of the gpu host), so a file whose key belongs to no live lease is left over from a killed
run. Each gpu worker clears its host's as it starts; beat's periodic job reaches one gpu worker at a time.
"""

from __future__ import annotations

import logging
import re
import threading
import time

from celery import shared_task
from celery.signals import worker_ready

from mas import names
from mas.config import Settings
from mas.pipeline import leases, rows
from mas.storage import storage

log = logging.getLogger(__name__)

_KEY = re.compile(rf"\.([0-9a-f]{{{leases.KEY_CHARS}}})\.partial\.")


CLEANUP_JOB = "cleanup"
"""The clean-up in `mas.pipeline.rows`: a file that cannot be removed is marked, tried again, then parked."""


def remove_partial_renders(settings: Settings) -> int:
    """Remove the partial files of renders that no live lease runs; one without a key once it is older
    than the longest render. One file at a time: one that cannot be removed is marked and skipped. Returns how
    many were removed."""
    live = leases.live_keys(settings)
    cutoff = time.time() - settings.gpu.max_render_seconds
    root = storage(settings).staging_root

    def remove(name: str) -> bool:
        path = root / name
        found = _KEY.search(path.name)
        if (found.group(1) not in live) if found else path.lstat().st_mtime < cutoff:
            path.unlink(missing_ok=True)
            return True
        return False

    partials = sorted(str(path.relative_to(root)) for path in root.glob("batch-*/*.partial.*"))
    removed = sum(rows.each(settings, CLEANUP_JOB, partials, remove).done.values())
    if removed:
        log.info("removed %d partial render file(s) of runs that ended", removed)
    return removed


@shared_task(name=names.CLEANUP, bind=True)
def remove_partials(self) -> int:
    """Beat's periodic clean-up, on the gpu queue: where the partial files are."""
    return remove_partial_renders(self.app.settings)


@worker_ready.connect
def remove_partials_on_start(sender=None, **_) -> None:
    """A gpu worker clears what its killed predecessor left on this host (in a thread: it is ready meanwhile)."""
    if sender is None or names.GPU_QUEUE not in (sender.app.amqp.queues.consume_from or {}):
        return

    def clear() -> None:
        try:
            remove_partial_renders(sender.app.settings)
        except Exception as exc:  # beat's periodic job tries again
            log.warning("partial renders not cleared at start: %s", exc)

    threading.Thread(target=clear, name="remove-partials", daemon=True).start()
