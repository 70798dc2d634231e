"""The gallery served in the test's own process as `mas serve` serves it (uvicorn), on a free loopback port."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from mas.config import Settings
from tests.harness.processes import wait_for


@dataclass
class ServedGallery:
    server: Any  # the uvicorn server: `should_exit` stops it
    thread: threading.Thread
    address: str  # 127.0.0.1:PORT

    @property
    def url(self) -> str:
        return f"http://{self.address}"


@contextmanager
def served_gallery(settings: Settings, *, timeout: float = 60) -> Iterator[ServedGallery]:
    """The gallery, up until the block ends (then stopped, its open streams ended after their grace)."""
    from mas.gallery import server

    srv = server(settings, host="127.0.0.1", port=0)
    thread = threading.Thread(target=srv.run, name="gallery", daemon=True)
    thread.start()
    wait_for(lambda: srv.started or not thread.is_alive(), timeout=timeout, what="the gallery")
    assert srv.started, "the gallery did not start"
    try:
        yield ServedGallery(srv, thread, f"127.0.0.1:{srv.servers[0].sockets[0].getsockname()[1]}")
    finally:
        srv.should_exit = True
        thread.join(10)
