"""Load the embedding model and the agent backend before a cpu worker's first task, so the first agent step
does not wait for them, and load the model once per worker rather than once per pool process.

Loading MiniLM takes under a second once its ONNX export exists, and the export, once per machine, 10-15 s;
importing an agent backend's client takes about 1 s (the `openai` package). Without this, the first archival
search and the first agent call of every new pool process pay it while a video waits (the first video of a
batch, on a freshly started worker). It loads in a background thread: Celery kills a pool process whose start-up
takes longer than a few seconds, and a task that needs the model meanwhile simply waits for the same load
(`get_embedder` holds a lock). Only processes of a worker consuming the cpu queue warm up; the gpu worker never
embeds.

A prefork worker loads both in its main process, before it forks its pool: every pool process inherits them
(copy on write) instead of loading its own copy of the weights.
"""

from __future__ import annotations

import logging
import threading
import time

from celery import current_app
from celery.signals import worker_init, worker_process_init

from mas import agents
from mas.domain.identity import STUDIO
from mas.errors import StudioError
from mas.memory.embeddings import EmbeddingUnavailable, get_embedder
from mas.names import CPU_QUEUE

log = logging.getLogger(__name__)


def _load() -> None:
    started = time.monotonic()
    try:
        agents.backend(current_app.settings, STUDIO)  # imports the configured backend's modules; calls nothing
    except StudioError as exc:  # the first task that needs it reports the same error
        log.warning("agent backend not preloaded: %s", exc)
    try:
        get_embedder(current_app.settings)
    except EmbeddingUnavailable as exc:
        log.warning("embedding model not preloaded: %s", exc)
        return
    log.info("embedding model loaded in %.1f s", time.monotonic() - started)


def _consumes_cpu_queue() -> bool:
    return CPU_QUEUE in (current_app.amqp.queues.consume_from or {})


@worker_init.connect
def load_before_forking(sender, **_) -> None:
    """In a prefork worker's main process, before the pool exists (the queues are known by now)."""
    if _consumes_cpu_queue() and "prefork" in str(sender.pool_cls):
        _load()


@worker_process_init.connect
def warm_embedder(**_) -> None:
    """In each pool process: nothing to do when the main process loaded the model before forking."""
    if _consumes_cpu_queue():
        threading.Thread(target=_load, name="warm-embedder", daemon=True).start()
