"""Load the embedding model as each cpu pool process starts, so the first agent step does not wait for it.

Loading MiniLM takes 5-12 s on a small machine; without this, the first archival search of every new
pool process pays it while a video waits. It loads in a background thread: Celery kills a pool process
whose start-up takes longer than a few seconds, and a task that needs the model meanwhile simply waits
for the same load (`get_embedder` holds a lock). Only processes of a worker consuming the cpu queue warm
up; the gpu worker never embeds.
"""

from __future__ import annotations

import logging
import threading
import time

from celery import current_app
from celery.signals import worker_process_init

from mas.memory.embeddings import EmbeddingUnavailable, get_embedder
from mas.names import CPU_QUEUE

log = logging.getLogger(__name__)


def _load() -> None:
    started = time.monotonic()
    try:
        get_embedder(current_app.settings)
    except EmbeddingUnavailable as exc:  # the first task that needs it reports the same error
        log.warning("embedding model not preloaded: %s", exc)
        return
    log.info("embedding model loaded in %.1f s", time.monotonic() - started)


@worker_process_init.connect
def warm_embedder(**_) -> None:
    if CPU_QUEUE not in (current_app.amqp.queues.consume_from or {}):
        return
    threading.Thread(target=_load, name="warm-embedder", daemon=True).start()
