"""Every name the studio shares across processes: Celery task names, queue names, Redis keys, lock names.

A task's registered name is what queued messages and beat entries carry, so these strings never change;
code refers to the constants, never to a literal, so a reader finds every sender and the receiver of a
task by one name.
"""

from __future__ import annotations

import hashlib
from typing import Literal, get_args

# --- queues ---------------------------------------------------------------------------------------------

CPU_QUEUE = "cpu"
"""Agent steps: planning, prompts, review, consolidation, maintenance. Any number of cpu workers."""

GPU_QUEUE = "gpu"
"""Renders and the other gpu tasks."""

GRADE_QUEUE = "gpu-grade"
"""Gradings: consumed by the gpu worker too, kept apart from renders so models do not swap per video."""

URGENT_SUFFIX = "-urgent"
"""A queue named with this suffix holds high-priority work (A/B tests, `mas grade`, `--priority high`):
its workers poll it first (see `mas.runtime.queue_order`)."""


def is_urgent(queue: str) -> bool:
    """True for a queue of high-priority work."""
    return queue.endswith(URGENT_SUFFIX)


CPU_URGENT_QUEUE = CPU_QUEUE + URGENT_SUFFIX
GPU_URGENT_QUEUE = GPU_QUEUE + URGENT_SUFFIX
"""High-priority renders and gradings."""

URGENT_QUEUE_OF = {CPU_QUEUE: CPU_URGENT_QUEUE, GPU_QUEUE: GPU_URGENT_QUEUE, GRADE_QUEUE: GPU_URGENT_QUEUE}
"""Where a task of a queue goes when its work is high priority."""

WORKER_QUEUES = {"cpu": (CPU_URGENT_QUEUE, CPU_QUEUE), "gpu": (GPU_URGENT_QUEUE, GPU_QUEUE, GRADE_QUEUE)}
"""What `mas worker --queue KIND` consumes."""

Priority = Literal["high", "normal"]
"""A request's priority: high work goes to the urgent queues."""

PRIORITIES: tuple[Priority, ...] = get_args(Priority)

# --- tasks ----------------------------------------------------------------------------------------------

TASK_PACKAGES = (
    "tasks.startup",
    "tasks.health",
    "tasks.pipeline",
    "tasks.sleeptime",
    "tasks.maintenance",
    "tasks.warmup",
    "tasks.takeover",
    "tasks.webhooks",
    "gpu.health",
    "gpu.maintenance",
    "gpu.tasks",
)
"""Modules the Celery app imports to register tasks (by name: `mas` never imports them itself)."""

PING = "tasks.health.ping"
COLLECT = "tasks.health.collect"
GPU_PING = "gpu.health.ping"

PLAN_BATCH = "tasks.pipeline.plan_batch"
CONSOLIDATE = "tasks.pipeline.consolidate"
RESUME_BATCH = "tasks.pipeline.resume_batch"

REGRADE = "gpu.tasks.regrade"
TUNE = "gpu.tasks.tune"

MAINTAIN_BUFFERS = "tasks.maintenance.maintain_buffers"
RECONCILE = "tasks.maintenance.reconcile"
RECOVER = "tasks.maintenance.recover"
RUN_SCHEDULES = "tasks.maintenance.run_schedules"
EXPIRE_IDEMPOTENCY_KEYS = "tasks.maintenance.expire_idempotency_keys"
EXPIRE_EVENTS = "tasks.maintenance.expire_events"
CLEANUP = "gpu.maintenance.remove_partials"

DELIVER_WEBHOOKS = "tasks.webhooks.deliver"

# --- Redis keys -----------------------------------------------------------------------------------------

GPU_STATS_PREFIX = "mas:gpu:stats:"
"""Followed by a gpu worker's name: that worker's model residency counters and GPU turns, as JSON."""


def gpu_stats_key(worker: str) -> str:
    """Where the gpu worker named `worker` publishes its stats (each worker its own key)."""
    return GPU_STATS_PREFIX + worker


PROGRESS_CHANNEL_PREFIX = "mas:progress:"
"""Followed by a user's name: the pub/sub channel where the renders of that user's batches publish their
progress (`mas.outbox.progress`); nothing is stored under it."""


def progress_channel(user: str) -> str:
    """The pub/sub channel of the render progress of `user`'s batches."""
    return PROGRESS_CHANNEL_PREFIX + user


def deliveries_key(task_id: str, retries: int) -> str:
    """Counter of deliveries of one run of a task (Redis keeps no delivery count of its own)."""
    return f"mas:deliveries:{task_id}:{retries}"


def login_failures_key(kind: str, who: str) -> str:
    """Counter of the failed logins in the current window of one user name (`kind` "user") or one client address
    ("address"), named by a digest: a name a client sends may be long or anything at all."""
    return f"mas:login-failures:{kind}:{hashlib.sha256(who.encode(errors='replace')).hexdigest()[:32]}"


# --- PostgreSQL advisory locks (see mas.locks) ----------------------------------------------------------

MIGRATION_LOCK = "migrations"
TUNE_LOCK = "tune"
LETTA_PROVISION_LOCK = "letta:provision"
WRITE_AHEAD_LOCK = "pacing:write-ahead"
EVENT_LOG_LOCK = "events:order"
"""Held from a transaction's insert into the event log to its commit: the log's ids commit in order
(`mas.outbox.eventlog`)."""


def agent_lock(conversation: str) -> str:
    """One call at a time to one conversation of a role (its messages must not interleave; Letta loses
    in-context messages on concurrent calls to one agent)."""
    return f"agent:{conversation}"


def endpoint_slot(url: str, slot: int) -> str:
    """One of the calls in flight an LLM endpoint is allowed (MAS_LLM_MAX_IN_FLIGHT); named by a digest of
    its URL, which may carry a password, since lock names appear in errors."""
    return f"llm:{hashlib.sha256(url.encode()).hexdigest()[:16]}:{slot}"


def quota_lock(user: str) -> str:
    """One submit at a time of one user, from counting their work against their quotas to storing the batch
    (`mas.pipeline.quotas`), so two submits at once cannot both pass on the same room."""
    return f"quota:{user}"


def block_lock(label: str) -> str:
    """One read-modify-write at a time of one core block kept on a server without compare-and-set."""
    return f"block:{label}"
