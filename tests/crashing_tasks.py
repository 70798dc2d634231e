"""Tasks that break their worker on purpose, loaded only by the reliability tests' workers
(`celery worker --include tests.crashing_tasks`).

`crash_worker` kills the worker process running it, every time: for the redelivery-cap test.
`fail_twice` fails, and so does its failure handler (as a step's does when the database is away): for the
test that such a task does not hold a gpu worker's slot (`mas.runtime.threads`).
"""

import os
import signal

from celery import shared_task

CRASH_TASK = "tasks.tests.crash_worker"  # a cpu task: a prefork worker outlives its pool processes
FAIL_TWICE_TASK = "gpu.tests.fail_twice"  # a gpu task: its worker runs tasks in threads


@shared_task(name=CRASH_TASK)
def crash_worker() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _failure_handler_fails(*_: object) -> None:  # Celery calls it with (task, exc, task_id, args, kwargs, einfo)
    raise RuntimeError("the failure could not be recorded either")


@shared_task(name=FAIL_TWICE_TASK, on_failure=_failure_handler_fails)
def fail_twice() -> None:
    raise RuntimeError("the task failed")
