"""Alembic environment: runs on the connection `mas.db` hands over (no ini file, no URL here)."""

from alembic import context

from mas.models import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata)
with context.begin_transaction():
    context.run_migrations()
