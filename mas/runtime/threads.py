"""The gpu worker's thread pool: Celery's, with an error that escapes a task's tracer reported as a failure.

Celery's tracer catches what a task raises, but not what its failure handling raises in turn: a step's
`on_failure` (`mas.pipeline.outcomes.fail_on_error`) that meets a database that is still away, a result
backend that stays away. Such an error leaves the tracer. The prefork pool passes it to the request's error
callback, which logs it and acknowledges the message as failed. Celery's thread pool hands it instead to a
`Future` that no one reads: neither callback runs, so the message is never acknowledged and its request stays
active. Each such message holds one of the worker's prefetch slots (1 + MAS_GPU_LOOKAHEAD) for good; once
they are all held the worker takes nothing more, retried steps included, and sits idle until it is
restarted (the soak benchmark's gpu worker after PostgreSQL's restart, when steps spent their retries while
the database was down). Here the error goes to the error callback, as with prefork: the task fails, its
message is acknowledged, and the video, not marked failed, is sent again by reconcile.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from billiard.einfo import ExceptionInfo
from celery import concurrency
from celery.concurrency import thread
from celery.concurrency.base import apply_target


def _apply(
    target: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    callback: Callable[..., Any] | None,
    accept_callback: Callable[..., Any] | None,
    error_callback: Callable[..., Any] | None,
) -> None:
    """`apply_target` (Celery's), with an `Exception` raised by `target` passed to `error_callback`."""
    failure: ExceptionInfo | None = None

    def traced(*a: Any, **kw: Any) -> Any:
        nonlocal failure
        try:
            return target(*a, **kw)
        except Exception:
            failure = ExceptionInfo()
            raise

    try:
        apply_target(traced, args, kwargs, callback, accept_callback)
    except Exception:
        if failure is None or error_callback is None:
            raise  # raised by a callback, not by the tracer: as before
        error_callback(failure)


class TaskPool(thread.TaskPool):
    """`celery.concurrency.thread.TaskPool` that reports a tracer's error to the request (see the module)."""

    def on_apply(
        self,
        target: Callable[..., Any],
        args: tuple[Any, ...] | None = None,
        kwargs: dict[str, Any] | None = None,
        callback: Callable[..., Any] | None = None,
        accept_callback: Callable[..., Any] | None = None,
        error_callback: Callable[..., Any] | None = None,
        **_: Any,
    ) -> thread.ApplyResult:
        future = self.executor.submit(
            _apply, target, args or (), kwargs or {}, callback, accept_callback, error_callback
        )
        return thread.ApplyResult(future)


def use_studio_pool() -> None:
    """Make `-P threads` (the gpu worker's pool, `mas.runtime.processes`) use this pool."""
    concurrency.ALIASES["threads"] = f"{__name__}:TaskPool"
