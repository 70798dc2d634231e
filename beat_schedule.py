"""The periodic jobs of the studio: one table, each job with its reason.

Start with `mas beat` (which runs `celery -A beat_schedule:app beat`).
"""

from celery.schedules import crontab

from mas.celery_app import app

SCHEDULE = {
    # The seed's maintenance v3 cron: buffers that grow unbounded degrade instruction-following, so
    # every 5 minutes each agent's buffer is summarized at 300 messages and reset at 500 / 600.
    "maintain-message-buffers": {
        "task": "tasks.maintenance.maintain_buffers",
        "schedule": crontab(minute="*/5"),
    },
    # Sleeptime consolidation also runs every N finished videos; this hourly run catches quiet periods
    # so LAST_ACTIVITY and LAST_SESSION_SUMMARY never go stale.
    "sleeptime-consolidation": {
        "task": "tasks.pipeline.consolidate",
        "schedule": crontab(minute=0),
    },
}

app.conf.beat_schedule = SCHEDULE
