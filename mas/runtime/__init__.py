"""The runtime: the Celery app and its queues, the services it runs on (PostgreSQL, Redis, embedded or
not), the processes a host runs (workers, beat, Flower) and work sent to a worker and waited for."""
