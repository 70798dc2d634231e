"""Settings from the environment: defaults, bad values refused by name, secrets never shown. Pure code: no server."""

import pytest
from pydantic import ValidationError

from mas.config import Settings, redact_url


def test_settings_defaults_and_env(monkeypatch, tmp_path):
    monkeypatch.setenv("MAS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("MAS_MAX_RETRIES", "5")
    s = Settings()
    assert s.quality.max_retries == 5 and s.quality.min_acceptable_grade == "B"
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


# --- groups ---------------------------------------------------------------------------------------


def test_every_variable_names_one_setting_of_one_group_and_keeps_its_name():
    """Grouping changed no MAS_ variable: each group's fields read the variables the flat settings read."""
    from mas.config import GROUPS, VARIABLES

    variables = [env for model in GROUPS.values() for env in (f.validation_alias for f in model.model_fields.values())]
    # the grouping's 104 (with data_dir and user: 106, as before), and thirteen added since:
    # MAS_READY_CACHE_SECONDS, MAS_IDEMPOTENCY_KEY_HOURS, MAS_IDEMPOTENCY_BUSY_SECONDS, MAS_WEBHOOK_ALLOWED_HOSTS,
    # the quotas' MAS_QUOTA_VIDEOS_PER_DAY, MAS_QUOTA_VIDEOS_WAITING, MAS_QUOTA_BATCHES_AT_ONCE, Sentinel's
    # MAS_REDIS_SENTINEL_MASTER, MAS_REDIS_SENTINEL_PASSWORD, and the event stream's MAS_STREAM_POLL_SECONDS,
    # MAS_STREAM_KEEPALIVE_SECONDS, MAS_STREAM_MAX, MAS_EVENT_RETENTION_DAYS; then the periodic jobs' bad rows'
    # MAS_ROW_MAX_TRIES, MAS_ROW_RETRY_SECONDS, the logins' MAS_LOGIN_FAILURES_PER_USER,
    # MAS_LOGIN_FAILURES_PER_ADDRESS, MAS_LOGIN_WINDOW_SECONDS, MAS_SCHEDULE_MAX_DAYS_AHEAD, MAS_DATABASE_WAIT_SECONDS,
    # and the login throttle's MAS_TRUSTED_PROXIES
    assert len(variables) == len(set(variables)) == len(VARIABLES) == 126
    assert all(str(env).startswith("MAS_") and str(env).isupper() for env in variables)
    assert VARIABLES["llm_url"] == ("llm", "url") and VARIABLES["write_ahead"] == ("scheduling", "write_ahead")
    assert VARIABLES["max_render_seconds"] == ("gpu", "max_render_seconds")


@pytest.mark.parametrize(
    ("variable", "value", "read"),
    [
        ("MAS_LLM_URL", "http://llm.example:8080/v1", lambda s: s.llm.url),
        ("MAS_GPU_STREAK_LIMIT", "3", lambda s: s.gpu.streak_limit),
        ("MAS_TORCH_DTYPE", "float32", lambda s: s.gpu.torch_dtype),
        ("MAS_WEBHOOK_MAX_ATTEMPTS", "4", lambda s: s.webhooks.max_attempts),
        ("MAS_OFFLINE_AGENT_SECONDS", "0.5", lambda s: s.agents.offline_seconds),
        ("MAS_STORAGE_URL", "s3://videos/studio", lambda s: s.storage.url),
        ("MAS_COMFYUI_NODES", '{"prompt": "1.text", "seed": "2.seed", "output": "3"}', lambda s: s.comfyui.nodes),
        ("MAS_QUOTA_VIDEOS_PER_DAY", "40", lambda s: s.quotas.videos_per_day),
        ("MAS_QUOTA_BATCHES_AT_ONCE", "0", lambda s: s.quotas.batches_at_once),
    ],
)
def test_each_variable_reaches_its_groups_field(monkeypatch, tmp_path, variable, value, read):
    monkeypatch.setenv("MAS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv(variable, value)
    got = read(Settings())
    assert str(got) == value or got == __import__("json").loads(value) or got == type(got)(value)


@pytest.mark.parametrize(
    ("group", "values", "message"),
    [
        ("database", {"MAS_DATABASE_URL": "mysql://x@y/z"}, "postgresql://"),
        ("broker", {"MAS_RESULT_BACKEND": "amqp://guest@localhost//"}, "redis://"),
        ("llm", {"MAS_LLM_URL": "ftp://llm.example"}, "http://"),
        ("letta", {"MAS_LETTA_URL": "letta"}, "http://"),
        ("comfyui", {"MAS_COMFYUI_NODES": "{not json"}, "not JSON"),
        ("quality", {"MAS_DQA_WEIGHTS": "[1, 2"}, "not JSON"),
        ("webhooks", {"MAS_WEBHOOK_URL": "http://127.0.0.1:9/hook"}, "needs MAS_WEBHOOK_SECRET"),
        ("reliability", {"MAS_LEASE_EXPIRY_SECONDS": "10", "MAS_LEASE_HEARTBEAT_SECONDS": "5"}, "2 x"),
        ("memory", {"MAS_BUFFER_WARN": "600", "MAS_BUFFER_CRITICAL": "500"}, "WARN < CRITICAL"),
    ],
)
def test_each_group_validates_itself(monkeypatch, group, values, message):
    """A group refuses its own bad values when it is read alone, without the rest of the settings."""
    from mas.config import GROUPS

    for name, value in values.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match=message):
        GROUPS[group]()
    others = [model for name, model in GROUPS.items() if name != group]
    assert all(model() is not None for model in others)  # no other group minds


def test_a_change_is_named_by_its_variable_validated_again_and_an_unknown_name_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("MAS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("MAS_LLM_MODEL", "from-the-environment")
    settings = Settings(write_ahead=3)
    assert settings.scheduling.write_ahead == 3 and settings.llm.model == "from-the-environment"
    changed = settings.changed(gpu_lookahead=0, llm_url="http://other:1/v1")
    assert (changed.gpu.lookahead, changed.llm.url, changed.scheduling.write_ahead) == (0, "http://other:1/v1", 3)
    assert settings.gpu.lookahead == 1  # the original is unchanged
    with pytest.raises(ValidationError, match="MAS_VISIBILITY_TIMEOUT_SECONDS"):
        # across groups: a broker's timeout that is set must outlast a render (unset, it follows the render's)
        settings.changed(visibility_timeout_seconds=7200).changed(max_render_seconds=7200)
    for wrong in ({"writeahead": 2}, {"url": "http://x"}):
        with pytest.raises(TypeError, match="no setting"):
            settings.changed(**wrong)
        with pytest.raises(TypeError, match="no setting"):
            settings.model_copy(update=wrong)  # never set unchecked
        with pytest.raises(TypeError, match="no setting"):
            Settings(**wrong)


def test_the_settings_shown_keep_the_names_they_had(monkeypatch, tmp_path):
    """`mas config` shows every setting by its variable's name without MAS_, as before the grouping."""
    monkeypatch.setenv("MAS_DATA_DIR", str(tmp_path))
    shown = Settings().describe()
    # the 106 of the grouping, and twenty-two added since (see the test above), less MAS_USER: the CLI's default
    # user, not a setting (who acts is an `Actor`, the same settings for everyone)
    assert len(shown) == 127 and "user" not in shown
    assert {"data_dir", "llm_url", "write_ahead", "gpu_lookahead", "webhook_secret", "vae_tiling"} <= set(shown)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("MAS_LLM_MAX_TOKENS", "-1"),
        ("MAS_GPU_DEVICE", "gpu zero"),
        ("MAS_WEBHOOK_TIMEOUT_SECONDS", "0"),
        ("MAS_DATABASE_URL", "mysql://x@y/z"),
        ("MAS_AB_PROPOSALS", "99"),
        ("MAS_QUOTA_VIDEOS_WAITING", "-1"),
    ],
)
def test_a_bad_value_in_any_group_is_named_by_its_variable(monkeypatch, tmp_path, variable, value):
    from mas.cli.context import load_settings
    from mas.errors import InvalidSettings

    monkeypatch.setenv("MAS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv(variable, value)
    with pytest.raises(InvalidSettings, match=f"invalid {variable}:"):
        load_settings()


def test_quotas_are_unset_by_default_and_a_webhook_secret_has_one_rule_for_the_studio_and_its_users(
    monkeypatch, tmp_path
):
    from mas.config import check_webhook_secret

    monkeypatch.setenv("MAS_DATA_DIR", str(tmp_path))
    quotas = Settings().quotas
    assert (quotas.videos_per_day, quotas.videos_waiting, quotas.batches_at_once) == (None, None, None)
    good = "whsec_" + "A" * 32  # the base64 of 24 bytes
    assert check_webhook_secret(good) == good
    for bad in ("whsec_short", "whsec_" + "A" * 31 + "!", "", "whsec_" + "A" * 28):
        with pytest.raises(ValueError, match="a webhook secret must be whsec_") as refused:
            check_webhook_secret(bad)
        assert not bad or bad not in str(refused.value)  # the value is never repeated
    monkeypatch.setenv("MAS_WEBHOOK_SECRET", "whsec_short")
    with pytest.raises(ValidationError, match="MAS_WEBHOOK_SECRET must be whsec_"):
        Settings()
