"""How work is shared out, how lost work is found again, and how much work one user may ask for."""

from __future__ import annotations

from pydantic import Field, model_validator

from mas.config.base import Group


class SchedulingSettings(Group):
    """How work is shared out: cpu processes, how far prompts are written ahead, high priority against normal."""

    cpu_concurrency: int = Field(
        validation_alias="MAS_CPU_CONCURRENCY", default=2, ge=1, le=256, description="Processes of a cpu worker."
    )
    write_ahead: int = Field(
        validation_alias="MAS_WRITE_AHEAD",
        default=8,
        ge=1,
        le=100_000,
        description="Videos of normal-priority batches written or being written and not yet rendered, "
        "studio-wide: a planned video's prompt is written when fewer are ahead of the GPUs (later prompts then "
        "learn from earlier gradings, and a cancel wastes less). Enough for every gpu worker's lookahead plus "
        "the writes that take as long as a render; high-priority work is never held back.",
    )
    priority_streak_limit: int = Field(
        validation_alias="MAS_PRIORITY_STREAK_LIMIT",
        default=20,
        ge=1,
        description="After this many high-priority tasks in a row, a worker takes one waiting normal task "
        "first, so a stream of interactive work never starves a batch.",
    )
    priority_head_start_seconds: float = Field(
        validation_alias="MAS_PRIORITY_HEAD_START_SECONDS",
        default=600.0,
        ge=0,
        description="Inside a gpu worker (and ComfyUI's queue), a high-priority task goes ahead of normal ones "
        "that arrived less than this long before it; older normal tasks keep their place.",
    )
    schedule_max_days_ahead: float = Field(
        validation_alias="MAS_SCHEDULE_MAX_DAYS_AHEAD",
        default=366,
        gt=0,
        le=3660,
        description="How far ahead a schedule (`mas enqueue --at`, the API's `at`) may start: a later time is "
        "refused when it is given, as a mistake.",
    )


class ReliabilitySettings(Group):
    """How lost work is found and sent again: deliveries, reconcile, step leases."""

    max_deliveries: int = Field(
        validation_alias="MAS_MAX_DELIVERIES",
        default=3,
        ge=1,
        le=100,
        description="A task delivered more often than this (its worker kept dying) is given up.",
    )
    reconcile_every_seconds: float = Field(
        validation_alias="MAS_RECONCILE_EVERY_SECONDS",
        default=10,
        gt=0,
        description="How often beat runs reconcile (re-sends what the broker lost).",
    )
    reconcile_after_seconds: int = Field(
        validation_alias="MAS_RECONCILE_AFTER_SECONDS",
        default=30,
        gt=0,
        description="A video with no progress this long and no live task is re-sent.",
    )
    lease_heartbeat_seconds: float = Field(
        validation_alias="MAS_LEASE_HEARTBEAT_SECONDS",
        default=5,
        gt=0,
        description="How often a running step renews its lease, telling reconcile it is alive.",
    )
    lease_expiry_seconds: float = Field(
        validation_alias="MAS_LEASE_EXPIRY_SECONDS",
        default=20,
        gt=0,
        description="A step lease not renewed this long is dead (its worker is gone): the step is re-sent and "
        "the next delivery takes it over. Must exceed 2 x MAS_LEASE_HEARTBEAT_SECONDS.",
    )
    row_max_tries: int = Field(
        validation_alias="MAS_ROW_MAX_TRIES",
        default=5,
        ge=1,
        le=100,
        description="A row a periodic job cannot process (a schedule, a buffer, a user's tuning, a file) is "
        "tried this often, then parked: skipped until a person sees to it. Its error shows in the listings.",
    )
    row_retry_seconds: float = Field(
        validation_alias="MAS_ROW_RETRY_SECONDS",
        default=60,
        ge=0,
        le=3600,
        description="The wait before a failed row is tried again; it doubles with each failure, up to an hour.",
    )
    database_wait_seconds: float = Field(
        validation_alias="MAS_DATABASE_WAIT_SECONDS",
        default=60,
        gt=0,
        le=3600,
        description="How long a database that is away (a restart, a failover) is waited out where work or a "
        "person waits on it: a finished step (a render) keeps its result and records it once the database "
        "answers; `mas enqueue --wait`, `mas status --follow` and the event streams say 'database failing over' "
        "meanwhile. Past it the step takes its retryable path, a watcher exits 1 saying so, a stream ends (its "
        "client resumes by Last-Event-ID).",
    )

    @model_validator(mode="after")
    def _check_leases(self) -> ReliabilitySettings:
        if self.lease_expiry_seconds <= 2 * self.lease_heartbeat_seconds:
            raise ValueError("MAS_LEASE_EXPIRY_SECONDS must exceed 2 x MAS_LEASE_HEARTBEAT_SECONDS")
        return self


class QuotaSettings(Group):
    """How much work one user may ask for, studio-wide: the defaults of every user, which a user's own quota
    (`mas users set`) overrides. Unset: no limit. A submit beyond one is refused whole."""

    videos_per_day: int | None = Field(
        validation_alias="MAS_QUOTA_VIDEOS_PER_DAY",
        default=None,
        ge=0,
        le=2**31 - 1,
        description="Videos a user's batches made in the last 24 hours may ask for in all, the new batch's "
        "included; unset: no limit.",
    )
    videos_waiting: int | None = Field(
        validation_alias="MAS_QUOTA_VIDEOS_WAITING",
        default=None,
        ge=0,
        le=2**31 - 1,
        description="Videos of a user not yet accepted, failed or cancelled (a batch not yet planned counts its "
        "videos), the new batch's included; unset: no limit.",
    )
    batches_at_once: int | None = Field(
        validation_alias="MAS_QUOTA_BATCHES_AT_ONCE",
        default=None,
        ge=0,
        le=2**31 - 1,
        description="Batches of a user queued, running or paused at once, the new one included; unset: no limit.",
    )
