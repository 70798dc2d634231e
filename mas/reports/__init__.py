"""What the studio tells people and programs, read-only: the questions the CLI, the API and the gallery ask
(queries.py) and /metrics for Prometheus (metrics.py)."""
