"""Health checks of the cpu queue: which worker answered, and a join for fan-in checks."""

from celery import shared_task

from mas import names


@shared_task(name=names.PING, bind=True)
def ping(self, tag: str = "") -> dict:
    """Answer with the host and queue that ran this task."""
    return {"queue": names.CPU_QUEUE, "worker": self.request.hostname, "tag": tag}


@shared_task(name=names.COLLECT)
def collect(results: list[dict]) -> dict:
    """Join the answers of a fan-out (the body of a chord)."""
    return {"queues": sorted(r["queue"] for r in results), "count": len(results)}
