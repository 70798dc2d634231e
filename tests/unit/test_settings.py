"""Settings from the environment: defaults, bad values refused by name, secrets never shown. Pure code: no server."""

import pytest
from pydantic import ValidationError

from mas.config import Settings, redact_url


def test_settings_defaults_and_env(monkeypatch, tmp_path):
    monkeypatch.setenv("MAS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("MAS_MAX_RETRIES", "5")
    s = Settings()
    assert s.max_retries == 5 and s.min_acceptable_grade == "B"
    assert s.embedded_database and s.embedded_broker
    assert s.effective_broker_url.startswith("redis+socket://")


@pytest.mark.parametrize(
    "name,value",
    [
        ("MAS_DATABASE_URL", "mysql://x@y/z"),
        ("MAS_DATABASE_URL", "not a url"),
        ("MAS_BROKER_URL", "amqp://guest@localhost//"),
        ("MAS_BROKER_URL", "redis://"),
        ("MAS_MAX_RETRIES", "0"),
        ("MAS_VISIBILITY_TIMEOUT_SECONDS", "60"),
    ],
)
def test_bad_settings_refused(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError):
        Settings()


def test_secrets_never_shown(monkeypatch):
    monkeypatch.setenv("MAS_DATABASE_URL", "postgresql://studio:hunter2@db.example:5432/mas")
    monkeypatch.setenv("MAS_FLOWER_PASSWORD", "sekret")
    shown = " ".join(Settings().describe().values())
    assert "hunter2" not in shown and "sekret" not in shown
    assert redact_url("redis://:pw@host:6379/0") == "redis://:***@host:6379/0"
