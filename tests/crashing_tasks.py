"""A task that kills the worker process running it, every time: for the redelivery-cap test.

Loaded only by that test's cpu worker (`celery worker --include tests.crashing_tasks`).
"""

import os
import signal

from celery import shared_task

CRASH_TASK = "tasks.tests.crash_worker"  # a cpu task: a prefork worker outlives its pool processes


@shared_task(name=CRASH_TASK)
def crash_worker() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
