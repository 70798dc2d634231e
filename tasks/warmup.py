"""Load the embedding model and the agent backend as each cpu pool process starts, so the first agent step
does not wait for them.

Loading MiniLM takes 5-12 s on a small machine, and importing an agent backend's client about 1 s (the
`openai` package); without this, the first archival search and the first agent call of every new pool
process pay it while a video waits (the first video of a batch, on a freshly started worker). It loads in
a background thread: Celery kills a pool process whose start-up takes longer than a few seconds, and a task
that needs the model meanwhile simply waits for the same load (`get_embedder` holds a lock). Only processes
of a worker consuming the cpu queue warm up; the gpu worker never embeds.
"""

from __future__ import annotations

import logging
import threading
import time

from celery import current_app
from celery.signals import worker_process_init

from mas import agents
from mas.errors import StudioError
from mas.memory.embeddings import EmbeddingUnavailable, get_embedder
from mas.names import CPU_QUEUE

log = logging.getLogger(__name__)


def _load() -> None:
    started = time.monotonic()
    try:
        agents.backend(current_app.settings)  # imports the configured backend's modules; calls nothing
    except StudioError as exc:  # the first task that needs it reports the same error
        log.warning("agent backend not preloaded: %s", exc)
    try:
        get_embedder(current_app.settings)
    except EmbeddingUnavailable as exc:
        log.warning("embedding model not preloaded: %s", exc)
        return
    log.info("embedding model loaded in %.1f s", time.monotonic() - started)


@worker_process_init.connect
def warm_embedder(**_) -> None:
    if CPU_QUEUE not in (current_app.amqp.queues.consume_from or {}):
        return
    threading.Thread(target=_load, name="warm-embedder", daemon=True).start()
