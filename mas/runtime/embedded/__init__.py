"""The embedded PostgreSQL + pgvector and Redis that `mas up` starts when no server URLs are configured."""
