"""Failover without servers: URLs that name a primary and its standbys or a list of Sentinels are read, rewritten
for SQLAlchemy, redacted and checked; the errors a failover causes are told apart from the others; the Celery
app is configured for Sentinel. The failovers themselves run on real servers in tests/system/test_failover.py."""

from __future__ import annotations

import psycopg
import pytest
import sqlalchemy as sa
from kombu.transport import resolve_transport
from pydantic import ValidationError

from mas import urls
from mas.config import Settings
from mas.errors import RetryableError
from mas.outbox.targets import service_hosts
from mas.redaction import redact_text, redact_url
from mas.runtime import broker
from mas.runtime.app import DATABASE_AWAY, celery_config
from mas.runtime.failover import DatabaseAway, is_away

PAIR = "postgresql://studio:s3cret@db-a.example:5432,db-b.example:5433/mas"
SENTINELS = "sentinel://:r3dis@s1.example:26379/2;sentinel://:r3dis@s2.example;sentinel://:r3dis@s3.example:26380"


def test_a_primary_and_its_standbys_are_read_from_libpqs_multi_host_url():
    assert urls.database_servers(PAIR) == [urls.Server("db-a.example", 5432), urls.Server("db-b.example", 5433)]
    assert urls.database_servers("postgresql://u:p@/mas?host=a,b&port=1,2") == [urls.Server("a", 1), urls.Server("b", 2)]
    assert urls.database_servers("postgresql://postgres:@/postgres?host=/tmp/sockets&port=5433") == []  # a socket
    assert urls.database_servers("postgresql://u:p@[::1]:5432,[fd00::2]/mas") == [
        urls.Server("::1", 5432),
        urls.Server("fd00::2", None),
    ]
    assert urls.libpq_database_url(PAIR.replace("postgresql:", "postgresql+psycopg:")) == PAIR


def test_sqlalchemy_gets_several_hosts_as_parameters_and_the_primary_asked_for():
    rewritten = urls.sqlalchemy_database_url(PAIR + "?sslmode=disable")
    assert rewritten == (
        "postgresql+psycopg://studio:s3cret@/mas?host=db-a.example,db-b.example&port=5432,5433"
        "&sslmode=disable&target_session_attrs=read-write"
    )
    url = sa.make_url(rewritten)
    args = sa.create_engine(url).dialect.create_connect_args(url)[1]
    assert (args["host"], args["port"], args["target_session_attrs"]) == ("db-a.example,db-b.example", "5432,5433", "read-write")
    assert "target_session_attrs=primary" in urls.sqlalchemy_database_url(PAIR + "?target_session_attrs=primary")
    assert "read-write" not in urls.sqlalchemy_database_url(PAIR + "?target_session_attrs=primary")
    one = "postgres://studio:pw@db.example:5432/mas"
    assert urls.sqlalchemy_database_url(one) == "postgresql+psycopg://studio:pw@db.example:5432/mas"  # unchanged
    with pytest.raises(ValueError, match="twice"):
        urls.sqlalchemy_database_url(PAIR + "?host=other")


def test_a_sentinel_list_is_read_and_every_password_in_it_hidden():
    given = urls.sentinels(SENTINELS)
    assert [str(s) for s in given.servers] == ["s1.example:26379", "s2.example:26379", "s3.example:26380"]
    assert (given.username, given.password, given.db) == (None, "r3dis", 2)
    shown = redact_url(SENTINELS)
    assert "r3dis" not in shown and all(host in shown for host in ("s1.example", "s2.example", "s3.example"))
    assert redact_text(f"cannot reach {SENTINELS} now") == f"cannot reach {shown} now"
    assert redact_url(PAIR) == "postgresql://studio:***@db-a.example:5432,db-b.example:5433/mas"
    with pytest.raises(ValueError, match="sentinel://"):
        urls.sentinels("sentinel://s1:26379;redis://s2:6379")


def test_settings_take_both_and_name_every_host(monkeypatch, tmp_path):
    monkeypatch.setenv("MAS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("MAS_DATABASE_URL", PAIR)
    monkeypatch.setenv("MAS_BROKER_URL", SENTINELS)
    with pytest.raises(ValidationError, match="MAS_REDIS_SENTINEL_MASTER"):
        Settings()
    monkeypatch.setenv("MAS_REDIS_SENTINEL_MASTER", "studio")
    monkeypatch.setenv("MAS_REDIS_SENTINEL_PASSWORD", "sentinels-own")
    settings = Settings()
    assert {"s3cret", "r3dis", "sentinels-own"} <= set(settings.secret_values())
    shown = " ".join(settings.describe().values())
    assert not any(secret in shown for secret in ("s3cret", "r3dis", "sentinels-own"))
    hosts = service_hosts(settings)  # a webhook may go to none of the studio's own servers
    assert {"db-a.example", "db-b.example", "s1.example", "s2.example", "s3.example"} <= hosts

    config = celery_config(settings)
    for options in (config["broker_transport_options"], config["result_backend_transport_options"]):
        assert options["master_name"] == "studio"
        assert options["sentinel_kwargs"]["password"] == "sentinels-own"
        assert options["sentinel_kwargs"]["socket_timeout"] > 0  # a dead Sentinel is passed over
    broker.use_studio_transport()
    assert resolve_transport("sentinel") is broker.SentinelTransport


@pytest.mark.parametrize(
    "value",
    [
        "postgresql://u:p@a:5432,b:notaport/mas",
        "postgresql://u:p@a:5432,:5433/mas",
        "mysql://u:p@a,b/mas",
    ],
)
def test_a_database_url_that_cannot_work_is_refused_without_its_password(monkeypatch, value):
    monkeypatch.setenv("MAS_DATABASE_URL", value)
    with pytest.raises(ValidationError) as refused:
        Settings()
    assert ":p@" not in str(refused.value)


@pytest.mark.parametrize(
    ("error", "away"),
    [
        (psycopg.errors.ReadOnlySqlTransaction("cannot execute INSERT in a read-only transaction"), True),
        (psycopg.errors.AdminShutdown("terminating connection due to administrator command"), True),
        (psycopg.errors.CrashShutdown("terminating connection because of crash of another server process"), True),
        (psycopg.errors.CannotConnectNow("the database system is in recovery mode"), True),
        (psycopg.errors.ConnectionFailure("connection failure"), True),
        (psycopg.OperationalError("connection failed: Connection refused"), True),
        (psycopg.errors.UniqueViolation("duplicate key"), False),
        (psycopg.errors.DeadlockDetected("deadlock detected"), False),
        (psycopg.errors.LockNotAvailable("canceling statement due to lock timeout"), False),
        (psycopg.errors.QueryCanceled("canceling statement due to statement timeout"), False),
    ],
)
def test_the_errors_a_failover_causes_are_told_from_the_others(error, away):
    assert is_away(error) is away
    assert is_away(sa.exc.DBAPIError.instance("insert", {}, error, psycopg.Error)) is away


def test_the_studios_database_error_is_retryable_and_waited_for_by_every_task():
    away = DatabaseAway("insert", {}, psycopg.errors.ReadOnlySqlTransaction("read-only"), connection_invalidated=True)
    assert isinstance(away, RetryableError) and isinstance(away, sa.exc.OperationalError)
    assert isinstance(away, DATABASE_AWAY)
    # waited out by StudioTask.__call__, never spent from a step's own retries: tests/unit/test_step_table.py
