"""Where the studio keeps its state: PostgreSQL, Redis (broker and result backend), and finished videos."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator

from mas import urls
from mas.config.base import Group, split_url
from mas.redaction import redact_url


class DatabaseSettings(Group):
    """PostgreSQL with pgvector: unset, an embedded one under the data directory."""

    url: str | None = Field(
        validation_alias="MAS_DATABASE_URL",
        default=None,
        description="PostgreSQL (with pgvector) URL. Unset: an embedded PostgreSQL under DATA_DIR. A primary and "
        "its standbys as libpq names them: postgresql://user:pw@h1:5432,h2:5432/db (the studio connects to "
        "whichever is the primary now: target_session_attrs=read-write unless the URL sets it).",
    )
    keepalive_seconds: int = Field(
        validation_alias="MAS_DATABASE_KEEPALIVE_SECONDS",
        default=10,
        ge=1,
        le=3600,
        description="TCP keepalive of database connections: a client host that vanished is noticed within about "
        "2.5 x this, and its locks released.",
    )

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        scheme = urls.scheme(value) if "://" in value else ""
        if scheme not in urls.POSTGRES_SCHEMES:
            raise ValueError(f"MAS_DATABASE_URL must be a postgresql:// URL, got scheme {scheme!r}")
        try:
            servers = urls.database_servers(value)
            urls.sqlalchemy_database_url(value)
        except ValueError as exc:
            raise ValueError(f"cannot read MAS_DATABASE_URL {redact_url(value)!r}: {exc}") from None
        if not (servers or "host=" in value.partition("?")[2]):
            raise ValueError("MAS_DATABASE_URL names no host")
        return value


class BrokerSettings(Group):
    """Redis, the broker and result backend: unset, an embedded one on a unix socket."""

    url: str | None = Field(
        validation_alias="MAS_BROKER_URL",
        default=None,
        description="Redis broker URL. Unset: an embedded Redis on a unix socket. Redis Sentinel: "
        "sentinel://:pw@h1:26379;sentinel://:pw@h2:26379;sentinel://:pw@h3:26379 (pw: the Redis servers' "
        "password) with MAS_REDIS_SENTINEL_MASTER.",
    )
    result_backend: str | None = Field(
        validation_alias="MAS_RESULT_BACKEND",
        default=None,
        description="Celery result backend URL (default: the broker); a Sentinel list as MAS_BROKER_URL takes it.",
    )
    sentinel_master: str | None = Field(
        validation_alias="MAS_REDIS_SENTINEL_MASTER",
        default=None,
        description="The name the Sentinels know the studio's Redis master by (`sentinel monitor NAME ...`); "
        "needed with sentinel:// URLs.",
    )
    sentinel_password: SecretStr | None = Field(
        validation_alias="MAS_REDIS_SENTINEL_PASSWORD",
        default=None,
        description="The Sentinels' own password (their requirepass), when they have one.",
    )
    visibility_timeout_seconds: int | None = Field(
        validation_alias="MAS_VISIBILITY_TIMEOUT_SECONDS",
        default=None,
        gt=0,
        le=7 * 86_400,
        description="Redis hands an unacknowledged task back to its queue after this long: a task whose worker "
        "died, or whose acknowledgement was lost with a Redis master (a step delivered again does its work "
        "once). It must exceed the longest a gpu task may be held, (1 + MAS_GPU_LOOKAHEAD) x "
        "MAS_MAX_RENDER_SECONDS (it may wait behind the lookahead, then render), or a running render is delivered "
        "again. Unset: that, plus half again for margin (5400 s with the defaults; 900 s for 5-minute renders "
        "with a lookahead of 1).",
    )

    @field_validator("url", "result_backend")
    @classmethod
    def _check_redis_url(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        if urls.is_sentinel(value):
            try:
                urls.sentinels(value)
            except ValueError as exc:
                raise ValueError(f"cannot read the Sentinel list {redact_url(value)!r}: {exc}") from None
            return value
        parts = split_url(value)
        if parts.scheme not in ("redis", "rediss", "redis+socket", "socket"):
            raise ValueError(f"expected a redis:// or sentinel:// URL, got scheme {parts.scheme!r}")
        if parts.scheme.startswith("redis") and parts.scheme != "redis+socket" and not parts.hostname:
            raise ValueError("the redis URL names no host")
        return value

    @model_validator(mode="after")
    def _check_sentinel(self) -> BrokerSettings:
        if (urls.is_sentinel(self.url) or urls.is_sentinel(self.result_backend)) and not self.sentinel_master:
            raise ValueError(
                "a sentinel:// URL needs MAS_REDIS_SENTINEL_MASTER: the name the Sentinels monitor the master by"
            )
        return self


class StorageSettings(Group):
    """Where finished videos live: the output folder, or an S3-compatible bucket every host reads."""

    url: str | None = Field(
        validation_alias="MAS_STORAGE_URL",
        default=None,
        description="s3://BUCKET[/PREFIX]: finished videos go to an S3-compatible bucket that every host reads "
        "(needs the s3 extra). Unset: the output folder.",
    )
    output_dir: Path | None = Field(
        validation_alias="MAS_OUTPUT_DIR",
        default=None,
        description="Where finished videos are written when MAS_STORAGE_URL is unset (default: DATA_DIR/videos; "
        "a shared mount when workers run on several hosts).",
    )
    s3_endpoint_url: str | None = Field(
        validation_alias="MAS_S3_ENDPOINT_URL",
        default=None,
        description="The S3-compatible server's URL (unset: AWS's endpoint for MAS_S3_REGION).",
    )
    s3_region: str = Field(validation_alias="MAS_S3_REGION", default="us-east-1", description="The bucket's region.")
    s3_access_key_id: str | None = Field(
        validation_alias="MAS_S3_ACCESS_KEY_ID",
        default=None,
        description="Access key of the bucket (unset: boto3's usual sources, e.g. AWS_ACCESS_KEY_ID).",
    )
    s3_secret_access_key: SecretStr | None = Field(
        validation_alias="MAS_S3_SECRET_ACCESS_KEY", default=None, description="Secret key of the bucket."
    )
