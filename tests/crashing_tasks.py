"""A task that kills the worker process running it, every time: for the redelivery-cap test.

Loaded only by that test's cpu worker (`celery worker --include tests.crashing_tasks`).
"""

import os
import signal

from mas.celery_app import app

CRASH_TASK = "tasks.tests.crash_worker"  # a cpu task: a prefork worker outlives its pool processes


@app.task(name=CRASH_TASK)
def crash_worker() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
