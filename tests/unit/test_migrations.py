"""The revision a process compares the database with before it reaches for alembic is alembic's head."""

from __future__ import annotations

from alembic.script import ScriptDirectory

from mas import db


def test_the_schema_revision_a_process_expects_is_the_newest_migration():
    assert ScriptDirectory.from_config(db.alembic_config()).get_current_head() == db.SCHEMA_REVISION
