"""The periodic jobs of the studio: one table, each job with its reason.

Start with `mas beat` (which runs `celery -A beat_schedule:app beat`). Every job is safe to run twice
(two beats, a restarted beat): each one decides from Postgres and changes state under row locks.
"""

from celery.schedules import crontab

from mas import names
from mas.config import Settings
from mas.domain.steps import NEW
from mas.runtime.app import Studio, default_app


def schedule(settings: Settings) -> dict:
    """The beat schedule for `settings`: every job waits in its queue with new work (`steps.NEW`)."""
    jobs = {
        # The seed's maintenance v3 cron: buffers that grow unbounded degrade instruction-following, so
        # every 5 minutes each agent's buffer is summarized at 300 messages and reset at 500 / 600.
        "maintain-message-buffers": {"task": names.MAINTAIN_BUFFERS, "schedule": crontab(minute="*/5")},
        # Sleeptime consolidation also runs every N finished videos; this hourly run catches quiet periods
        # so LAST_ACTIVITY and LAST_SESSION_SUMMARY never go stale.
        "sleeptime-consolidation": {"task": names.CONSOLIDATE, "schedule": crontab(minute=0)},
        # Lost messages (a wiped broker, a worker killed mid-task) are re-sent from Postgres: a video is lost
        # when no message carries it and no step of it has a live lease (MAS_LEASE_EXPIRY_SECONDS).
        "reconcile": {
            "task": names.RECONCILE,
            "schedule": settings.reliability.reconcile_every_seconds,
            "options": {"expires": settings.reliability.reconcile_every_seconds},  # a late run is dropped, not stacked
        },
        # Webhook events wait in Postgres (the outbox, `mas webhooks`) until a receiver takes them: each run tries
        # the new ones and those whose backoff has passed.
        "deliver-webhooks": {
            "task": names.DELIVER_WEBHOOKS,
            "schedule": settings.webhooks.every_seconds,
            "options": {"expires": settings.webhooks.every_seconds},  # a late run is dropped, not stacked
        },
        # Overnight batches (`mas enqueue --at 02:00 ...`) are stored in Postgres and started here.
        "run-scheduled-batches": {"task": names.RUN_SCHEDULES, "schedule": 30.0},
        # The JSON API's Idempotency-Keys older than MAS_IDEMPOTENCY_KEY_HOURS count as never used; this hourly
        # run deletes them (one DELETE), so the table holds about a day of keys.
        "expire-idempotency-keys": {"task": names.EXPIRE_IDEMPOTENCY_KEYS, "schedule": crontab(minute=45)},
        # The event log (what the API's event streams follow) keeps MAS_EVENT_RETENTION_DAYS of events; this hourly
        # run deletes older ones (one DELETE), so a stream can resume after anything shorter than that.
        "expire-events": {"task": names.EXPIRE_EVENTS, "schedule": crontab(minute=50)},
        # The Tuner retrains the preference adapter on the user's A/B choices every night (on the gpu queue);
        # with too few new pairs it says so and trains nothing.
        "nightly-dpo-retraining": {"task": names.TUNE, "schedule": crontab(hour=3, minute=15)},
        # Partial renders of killed workers are removed on the gpu host, where they are (a gpu worker also
        # clears its host's as it starts); task results expire by themselves (result_expires).
        "cleanup-partial-files": {"task": names.CLEANUP, "schedule": crontab(minute=30)},
    }
    return {name: {**job, "options": {"priority": NEW, **job.get("options", {})}} for name, job in jobs.items()}


def __getattr__(name: str) -> Studio:
    """`celery -A beat_schedule:app beat`: the app from the environment's settings, with the schedule."""
    if name != "app":
        raise AttributeError(name)
    app = default_app()
    app.conf.beat_schedule = schedule(app.settings)
    return app
