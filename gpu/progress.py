"""A render's progress for people watching, published off the render's path.

The render calls `publish` from its denoising loop or its websocket listener; a thread sends the latest
value to the result backend (the task's PROGRESS state: Flower, `mas status`) and on the batch user's progress
channel (`mas.outbox.progress`: the API's event streams, the gallery's pages). A Redis that is away (restarting)
delays or skips updates, never the render: the GPU does not wait on the broker.
"""

from __future__ import annotations

import logging
import threading

from mas.outbox import progress
from mas.pipeline.runner import StepRun

log = logging.getLogger(__name__)


class ProgressPublisher:
    def __init__(self, run: StepRun, *, batch_id: int) -> None:
        self.run = run
        self.batch_id = batch_id
        self.task_id = run.task.request.id  # the request is the running thread's: read it here, not in ours
        self._latest: tuple[int, int] | None = None
        self._changed = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._send_latest, name=f"progress-{run.video_id}", daemon=True)
        self._thread.start()

    def publish(self, done: int, total: int) -> None:
        with self._changed:
            self._latest = (done, total)
            self._changed.notify()

    def close(self) -> None:
        """Stop publishing; an update still being sent is left to finish on its own."""
        with self._changed:
            self._closed = True
            self._changed.notify()

    def _send_latest(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._closed or self._latest is not None)
                if self._closed:
                    return
                assert self._latest is not None
                (done, total), self._latest = self._latest, None
            meta = {**self.run.payload.to_json(), "step": self.run.step.name, "done": done, "total": total}
            try:
                self.run.task.update_state(task_id=self.task_id, state="PROGRESS", meta=meta)
            except Exception as exc:  # the render goes on; the next update may get through
                log.warning("progress of %s not published: %s", self.run.describe(), exc)
            try:
                progress.publish(
                    self.run.settings,
                    user=self.run.actor.user,
                    batch_id=self.batch_id,
                    video_id=self.run.video_id,
                    attempt=self.run.attempt,
                    step=self.run.step.name,
                    done=done,
                    total=total,
                )
            except Exception as exc:  # the same: nobody watching live is worth a render
                log.warning("progress of %s not published live: %s", self.run.describe(), exc)
