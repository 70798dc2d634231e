"""The Celery app, made from settings: a cpu and a gpu queue (and their urgent twins), routing by package and
by the pipeline's step table, JSON only, events on, late acks everywhere.

Tasks live in `tasks` (cpu queue) and `gpu` (gpu queue) as shared tasks: the app finds their modules by name
(`names.TASK_PACKAGES`) so that `mas` never imports them, and nothing is read from the environment at import.
`celery -A mas` gets its app from `mas.app` (`default_app`); a process that sends work gets it with
`app_for(settings)`. Every task derives from `StudioTask`, which caps redeliveries (a pipeline step's are
counted by its lease instead) and tries a failed run again as its `RetryPolicy` says: an agent task's is
`AgentTask`'s, a pipeline step's (`StepTask`) the one its entry in the step table declares, with its time limit.
"""

from __future__ import annotations

import logging
import math
from functools import partial

from celery import Celery, Task, current_app
from celery.exceptions import Ignore, Reject, Retry
from celery.signals import after_setup_logger, after_setup_task_logger
from celery.utils.time import get_exponential_backoff_interval
from kombu import Exchange, Queue
from kombu.transport.redis import PRIORITY_STEPS

from mas import names
from mas.config import Settings
from mas.domain.steps import ASKS_AN_AGENT, NEW, STEPS, RetryPolicy, Step
from mas.errors import PeerUnavailable, PermanentError
from mas.names import CPU_QUEUE, CPU_URGENT_QUEUE, GPU_QUEUE, GPU_URGENT_QUEUE, GRADE_QUEUE, URGENT_QUEUE_OF
from mas.redaction import redact_logs
from mas.runtime import failover
from mas.runtime.broker import use_studio_transport
from mas.runtime.clients import redis_client, sentinel_options
from mas.runtime.queue_order import StickyCycle
from mas.runtime.threads import use_studio_pool
from mas.singletons import per_process

log = logging.getLogger(__name__)

DATABASE_AWAY = failover.DATABASE_AWAY
"""PostgreSQL unreachable, restarting, still starting up or failing over (`mas.runtime.failover`)."""

CPU_TASK_TIME_LIMIT = 600  # seconds; an agent step that runs longer is killed and retried


def queue_keys(app: Celery, queue: str) -> list[str]:
    """The Redis lists holding a queue's waiting messages: kombu keeps one list per priority step."""
    options = app.conf.broker_transport_options
    sep = options.get("sep", "\x06\x16")
    return [queue] + [f"{queue}{sep}{step}" for step in options.get("priority_steps", PRIORITY_STEPS) if step]


def queue_of(app: Celery, task_name: str, *, priority: str = "normal") -> str:
    """The queue a task goes to: its route, or that route's urgent queue for high-priority work."""
    queue = app.amqp.router.route({}, task_name)["queue"].name
    return URGENT_QUEUE_OF.get(queue, queue) if priority == "high" else queue


def prioritized(app: Celery, signature, priority: str):
    """`signature` sent to its urgent queue when `priority` is high (unchanged otherwise)."""
    if priority == "high":
        signature = signature.clone()
        signature.set(queue=queue_of(app, signature.task, priority=priority))
    return signature


class StudioTask(Task):
    """Base of every studio task.

    Redeliveries after a lost worker are counted in Redis per task id and retry number; past
    `max_deliveries` the task is not run again: it fails with `GivenUp` (permanent), so its `on_failure`
    records the reason and the chain stops there.
    A database that is briefly away (a restart, a failover) is waited out with backed-off retries, whatever the
    task. A failed run is tried again as its `retry_policy` says, and only so (the step table's, for a step).
    """

    #: Deliveries allowed for one run of this task (None: `Settings.max_deliveries`).
    max_deliveries: int | None = None
    #: How a failed run is tried again (None: never, unless the task lists Celery's own `autoretry_for`).
    retry_policy: RetryPolicy | None = None
    #: Errors a task without a policy retries with Celery's backoff below (none by default).
    autoretry_for: tuple[type[BaseException], ...] = ()
    #: Back off 1, 2, 4 ... seconds between retries, at most `retry_backoff_max`, with jitter.
    retry_backoff: bool | int = True
    retry_backoff_max = 60
    #: PostgreSQL unreachable or restarting: waited out with backoff (1, 2, 4 ... 60 s, about ten minutes in all),
    #: never spent from a step's own retries (a render failing, a reply that does not parse).
    database_retries = 14
    #: Whether deliveries are counted elsewhere: a pipeline step's lease counts its claims in Postgres
    #: (`mas.pipeline.leases`), so it is not counted twice here.
    deliveries_counted_by_lease: bool = False

    @property
    def max_retries(self) -> int:
        """Retries of a run: its policy's; a task without one that asks for a retry itself, 12."""
        return self.retry_policy.times(self.app.settings) if self.retry_policy else 12

    def __call__(self, *args, **kwargs):
        if self.request.called_directly or self.request.id is None:
            return self.run(*args, **kwargs)
        if not self.deliveries_counted_by_lease:
            self._count_delivery()
        try:
            return self.run(*args, **kwargs)
        except (Ignore, Reject, Retry):
            raise
        except Exception as exc:
            self._try_again(exc)
            raise

    def _try_again(self, exc: Exception) -> None:
        """Raise the retry that `exc` calls for (or `exc` itself once those retries are spent); return when
        nothing tries it again."""
        policy = self.retry_policy
        settings = self.app.settings
        if isinstance(exc, DATABASE_AWAY):
            countdown = get_exponential_backoff_interval(
                factor=1,
                retries=self.request.retries,
                maximum=policy.backoff_max(settings) if policy else self.retry_backoff_max,
                full_jitter=True,
            )
            log.warning("%s[%s] waits for PostgreSQL (retry in %d s): %s", self.name, self.request.id, countdown, exc)
            raise self.retry(exc=exc, countdown=max(1, countdown), max_retries=self.database_retries) from exc
        if policy is None:
            return
        if isinstance(exc, PeerUnavailable) and policy.waits_for_peers:
            every = settings.agents.retry_backoff_max_seconds
            tries = max(1, math.ceil(settings.agents.peer_wait_seconds / every))
            log.warning(
                "%s[%s] waits for a peer (%d of %d, every %d s): %s",
                self.name,
                self.request.id,
                self.request.retries + 1,
                tries,
                every,
                exc,
            )
            raise self.retry(exc=exc, countdown=every, max_retries=tries) from exc
        if policy.tries_again(exc):
            countdown = get_exponential_backoff_interval(
                factor=policy.backoff,
                retries=self.request.retries,
                maximum=policy.backoff_max(settings),
                full_jitter=True,
            )
            raise self.retry(exc=exc, countdown=countdown, max_retries=policy.times(settings)) from exc

    def _count_delivery(self) -> None:
        """Count this delivery of this run in Redis (which keeps no count of its own); past the cap, give up."""
        cap = self.max_deliveries or self.app.settings.reliability.max_deliveries
        key = names.deliveries_key(self.request.id, self.request.retries)
        client = redis_client(self.app.settings)
        count = client.incr(key)
        client.expire(key, 86_400)
        if count > cap:
            log.error("%s[%s] delivered %d times; giving it up", self.name, self.request.id, count)
            raise GivenUp(f"delivered {count} times: its worker kept dying; given up")


class AgentTask(StudioTask):
    """Base of the tasks that ask an agent outside the step table (plan, consolidate): a reply that cannot be
    used yet is asked again with backoff, a server that is away is waited for (the batch waits and resumes when
    it returns), as a step that asks an agent is (`mas.domain.steps.ASKS_AN_AGENT`)."""

    retry_policy = ASKS_AN_AGENT


class StepTask(StudioTask):
    """A pipeline step (`mas.pipeline.runner.step_task`): its retries and time limit are those its entry in the
    step table declares (`mas.domain.steps.Step`), read from the app's settings when the task runs."""

    #: The step this task runs (set per task by `step_task`).
    step: Step
    deliveries_counted_by_lease = True

    @property
    def retry_policy(self) -> RetryPolicy:  # type: ignore[override]
        return self.step.retry

    @property
    def time_limit(self) -> float | None:
        """None: the app's limit for every task (`task_time_limit`)."""
        return None if self.step.time_limit is None else self.step.time_limit(self.app.settings)

    @property
    def soft_time_limit(self) -> float | None:
        """A little before the hard limit, so the step can clean up (a partial render) before it is killed."""
        limit = self.time_limit
        return None if limit is None else int(limit * 0.97)


@after_setup_logger.connect
@after_setup_task_logger.connect
def redact_worker_logs(logger=None, **_) -> None:
    """Every log line of a worker or beat goes out with its secrets redacted (URLs with passwords in
    error messages, API keys); see `mas.redaction`."""
    if logger is not None and isinstance(current_app, Studio):
        redact_logs(logger, current_app.settings.secret_values())


class GivenUp(PermanentError):
    """A task whose deliveries passed `MAS_MAX_DELIVERIES` (it kills its worker): not run again."""


class Studio(Celery):
    """The Celery app, carrying the studio's settings so tasks read configuration from one place."""

    def __init__(self, settings: Settings, **kwargs):
        super().__init__("mas", task_cls=StudioTask, **kwargs)
        self.settings = settings
        self.conf.update(celery_config(settings))


PUBLISH_RETRY_POLICY = {"max_retries": 40, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 2}
"""A message that cannot be published (Redis restarting, a network cut healing) is tried again on a fresh
connection for about a minute before the error is raised: a chain's next step, a retry, a progress update."""

HEALTH_CHECK_SECONDS = 10
"""A Redis connection idle this long is checked with a PING before it is used, so one left stale by a
restart or a network cut is replaced instead of failing a command with a broken pipe. TCP connections also
keep alive and give up connecting after 5 s (a unix socket takes neither option)."""


def _tcp(url: str) -> bool:
    return not url.startswith(("redis+socket://", "socket://"))


def celery_config(settings: Settings) -> dict:
    transport = {"visibility_timeout": settings.visibility_timeout_seconds}
    broker_transport = {
        **transport,
        "health_check_interval": HEALTH_CHECK_SECONDS,
        **({"socket_keepalive": True, "socket_connect_timeout": 5} if _tcp(settings.effective_broker_url) else {}),
        # The gpu worker stays with renders or gradings while that queue has work, so the video and
        # quality models do not alternate video by video (see mas.runtime.queue_order).
        "queue_order_strategy": partial(
            StickyCycle,
            streak_limit=settings.gpu.streak_limit,
            urgent_streak_limit=settings.scheduling.priority_streak_limit,
        ),
    }

    def queue(step: Step) -> str:
        return GPU_QUEUE if step.queue == GRADE_QUEUE and not settings.groups_gpu_work else step.queue

    return dict(
        broker_url=settings.effective_broker_url,
        result_backend=settings.effective_result_backend,
        # a Sentinel list: the master's name and how to log in to the Sentinels (`mas.runtime.clients`)
        broker_transport_options={**broker_transport, **sentinel_options(settings, settings.effective_broker_url)},
        result_backend_transport_options={
            **transport,
            **sentinel_options(settings, settings.effective_result_backend),
        },
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,  # a worker waits for its broker however long it is away
        task_publish_retry_policy=PUBLISH_RETRY_POLICY,
        redis_backend_health_check_interval=HEALTH_CHECK_SECONDS,
        redis_retry_on_timeout=True,
        **(
            {"redis_socket_connect_timeout": 5, "redis_socket_keepalive": True}
            if _tcp(settings.effective_result_backend)
            else {}
        ),
        result_backend_always_retry=True,  # a result or state that cannot be stored is retried, not raised
        result_backend_max_retries=40,
        result_backend_max_sleep_between_retries_ms=2000,
        include=list(names.TASK_PACKAGES),
        task_queues=(
            Queue(CPU_QUEUE, Exchange(CPU_QUEUE, type="direct"), routing_key=CPU_QUEUE),
            Queue(GPU_QUEUE, Exchange(GPU_QUEUE, type="direct"), routing_key=GPU_QUEUE),
            Queue(GRADE_QUEUE, Exchange(GRADE_QUEUE, type="direct"), routing_key=GRADE_QUEUE),
            Queue(CPU_URGENT_QUEUE, Exchange(CPU_URGENT_QUEUE, type="direct"), routing_key=CPU_URGENT_QUEUE),
            Queue(GPU_URGENT_QUEUE, Exchange(GPU_URGENT_QUEUE, type="direct"), routing_key=GPU_URGENT_QUEUE),
        ),
        task_default_queue=CPU_QUEUE,
        task_default_exchange=CPU_QUEUE,
        task_default_routing_key=CPU_QUEUE,
        # Routes name only the queue, so Celery publishes through the default exchange straight into the
        # queue's Redis list: no exchange binding is consulted, and a broker that lost its data (bindings
        # included) still routes every message from long-running workers.
        task_routes={
            **{step.task: {"queue": queue(step)} for step in STEPS},
            names.REGRADE: {"queue": GPU_URGENT_QUEUE},  # a person waits for `mas grade`
            "gpu.*": {"queue": GPU_QUEUE},
            "tasks.*": {"queue": CPU_QUEUE},
        },
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_track_started=True,
        task_send_sent_event=True,
        worker_send_task_events=True,
        worker_prefetch_multiplier=1,
        task_default_priority=NEW,  # a pipeline step's own level is set where its chain is made
        task_time_limit=CPU_TASK_TIME_LIMIT,  # gpu tasks set their own from MAS_MAX_RENDER_SECONDS
        result_expires=7 * 86_400,
        timezone="UTC",
        enable_utc=True,
    )


def create_app(settings: Settings) -> Studio:
    """A new Celery app for `settings` (on the studio's Redis transport, `mas.runtime.broker`; a worker with
    `-P threads` on the studio's thread pool, `mas.runtime.threads`)."""
    use_studio_transport()
    use_studio_pool()
    return Studio(settings)


def _broker_of(settings: Settings) -> tuple[str, str]:
    return settings.effective_broker_url, settings.effective_result_backend


def app_for(settings: Settings) -> Studio:
    """The app this process sends work with to the broker of `settings`: the worker's own app inside a
    worker, else one made once per process and broker."""
    current = current_app._get_current_object()
    if isinstance(current, Studio) and _broker_of(current.settings) == _broker_of(settings):
        return current
    return _made_for(settings)


@per_process(key=_broker_of)
def _made_for(settings: Settings) -> Studio:
    return create_app(settings)


def default_app() -> Studio:
    """The app of a worker or beat started by `celery -A mas` (settings from the environment)."""
    return app_for(Settings())
