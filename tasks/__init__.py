"""Celery tasks of the cpu queue: agent reasoning, pipeline assembly, maintenance."""
