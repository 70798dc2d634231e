"""One pattern for process-wide singletons: cached per process and key, forgotten in a forked child.

Clients, engines and provisioned ids are expensive to make and must not be shared across a fork (Celery's
prefork pool forks its workers): a child starts with an empty cache and makes its own. A value that holds no
connection or thread (a model's weights loaded before the pool forks) may be kept: `inherit=True`.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Hashable
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


def per_process(key: Callable[P, Hashable], *, inherit: bool = False) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """Decorate a factory so it runs once per process for each `key(*args, **kwargs)`; with `inherit`, a
    forked child keeps what its parent made (copy on write) instead of making its own.

    The decorated function gains `forget()`, which drops every cached value (say after the settings
    changed, or to start afresh in a test).
    """

    def decorate(factory: Callable[P, T]) -> Callable[P, T]:
        cache: dict[Hashable, Any] = {}
        lock = threading.Lock()

        @functools.wraps(factory)
        def get(*args: P.args, **kwargs: P.kwargs) -> T:
            k = key(*args, **kwargs)
            try:
                return cache[k]
            except KeyError:
                pass
            with lock:
                if k not in cache:
                    cache[k] = factory(*args, **kwargs)
                return cache[k]

        def forget() -> None:
            with lock:
                cache.clear()

        def after_fork() -> None:
            nonlocal lock
            lock = threading.Lock()  # a lock held by another thread at fork time stays held in the child
            if not inherit:
                cache.clear()

        os.register_at_fork(after_in_child=after_fork)
        get.forget = forget  # type: ignore[attr-defined]
        return get

    return decorate
