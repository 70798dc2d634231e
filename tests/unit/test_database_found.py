"""A process finds its database when it starts; a transaction in a process that never did is refused plainly,
with no server looked for or started."""

from __future__ import annotations

import pytest

from mas import db
from mas.config import Settings
from mas.errors import PermanentError
from mas.runtime.services import DatabaseNotFound


def test_a_session_before_the_database_is_found_is_refused_and_starts_nothing(tmp_path):
    settings = Settings(data_dir=tmp_path / "data", database_url=None)
    with pytest.raises(DatabaseNotFound, match=r"mas\.db\.find") as refused, db.session_scope(settings):
        pass
    assert isinstance(refused.value, PermanentError)
    assert not (tmp_path / "data").exists()  # no embedded server started, no folder made for one


def test_a_configured_database_is_used_as_written_with_nothing_looked_up(tmp_path):
    settings = Settings(data_dir=tmp_path / "data", database_url="postgresql://studio:pw@db.example:5432/mas")
    engine = db.ready_engine(settings)  # no connection made: the engine is lazy
    assert (engine.url.host, engine.url.port, engine.url.database) == ("db.example", 5432, "mas")
    assert not (tmp_path / "data").exists()
