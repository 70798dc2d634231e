"""What people and programs reach: the gallery, the JSON API and Flower, and the webhooks the studio sends."""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re

from pydantic import Field, SecretStr, field_validator, model_validator

from mas.config.base import Group, comma_list

HOST_NAME = re.compile(
    r"^(?=.{1,253}$)[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)*$"
)
"""A host name as MAS_WEBHOOK_ALLOWED_HOSTS takes it: lowercase ASCII labels (an international name in its xn-- form)."""


class ServiceSettings(Group):
    """The gallery, the JSON API and Flower: who may use them, and what a request may ask."""

    gallery_user: str | None = Field(
        validation_alias="MAS_GALLERY_USER", default=None, description="Gallery basic-auth user (`mas serve`)."
    )
    gallery_password: SecretStr | None = Field(
        validation_alias="MAS_GALLERY_PASSWORD", default=None, description="Gallery basic-auth password."
    )
    api_token: SecretStr | None = Field(
        validation_alias="MAS_API_TOKEN",
        default=None,
        description="Bearer token of the JSON API (`Authorization: Bearer TOKEN`), accepted beside the gallery's "
        "user and password. Beyond loopback `mas serve` needs one or the other.",
    )
    login_failures_per_user: int = Field(
        validation_alias="MAS_LOGIN_FAILURES_PER_USER",
        default=10,
        ge=1,
        le=10_000,
        description="Failed logins (basic auth) one user name may have in MAS_LOGIN_WINDOW_SECONDS; beyond them "
        "every login as that user is refused with 429 and Retry-After until the window ends, without checking "
        "the password (its hash is slow on purpose: guesses cost the server nothing more).",
    )
    login_failures_per_address: int = Field(
        validation_alias="MAS_LOGIN_FAILURES_PER_ADDRESS",
        default=30,
        ge=1,
        le=100_000,
        description="Failed logins one client address may have in MAS_LOGIN_WINDOW_SECONDS, whatever the user "
        "names; beyond them its logins are refused the same way (behind a proxy in MAS_TRUSTED_PROXIES, the "
        "client's address it names; behind any other, the proxy's).",
    )
    trusted_proxies: tuple[str, ...] = Field(
        validation_alias="MAS_TRUSTED_PROXIES",
        default=("127.0.0.1", "::1"),
        description="The reverse proxies in front of `mas serve`, comma-separated addresses or networks (CIDR): "
        "a request from one of them is taken to come from the client its X-Forwarded-For names (what the login "
        "throttle counts, what the logs show); from anyone else the header is ignored. Empty: no proxy is trusted.",
    )
    _parse_trusted_proxies = field_validator("trusted_proxies", mode="before")(comma_list)

    @field_validator("trusted_proxies")
    @classmethod
    def _check_trusted_proxies(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for entry in value:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(f"{entry!r} is not an address or a network (CIDR)") from None
        return value

    login_window_seconds: int = Field(
        validation_alias="MAS_LOGIN_WINDOW_SECONDS",
        default=300,
        ge=1,
        le=86_400,
        description="The window the failed logins are counted in (a fixed window, kept in Redis, so it holds "
        "across every `mas serve` process).",
    )
    ready_max_waiting: int = Field(
        validation_alias="MAS_READY_MAX_WAITING",
        default=10_000,
        gt=0,
        description="/readyz answers 503 while more tasks than this wait in the queues (the studio is full).",
    )
    ready_cache_seconds: float = Field(
        validation_alias="MAS_READY_CACHE_SECONDS",
        default=5,
        ge=0,
        le=3600,
        description="/readyz answers from its last checks for this long (a probe polled often does not ask "
        "every worker and endpoint each time); one refresh at a time.",
    )
    idempotency_key_hours: float = Field(
        validation_alias="MAS_IDEMPOTENCY_KEY_HOURS",
        default=24,
        gt=0,
        le=24 * 366,
        description="How long an Idempotency-Key is remembered: an older one counts as never used (a submit "
        "with it makes a new batch), and an hourly beat job deletes it.",
    )
    idempotency_busy_seconds: float = Field(
        validation_alias="MAS_IDEMPOTENCY_BUSY_SECONDS",
        default=300,
        gt=0,
        le=86_400,
        description="How long an Idempotency-Key claimed by a submit that never finished (its process died) "
        "answers busy before a retry takes it over; longer than a submit can take (the broker's checks, 5 s "
        "each, and a message's publish retries, about a minute plus up to 5 s per connection attempt).",
    )
    max_request_chars: int = Field(
        validation_alias="MAS_MAX_REQUEST_CHARS",
        default=2000,
        gt=0,
        le=100_000,
        description="Longest request accepted.",
    )
    max_batch_videos: int = Field(
        validation_alias="MAS_MAX_BATCH_VIDEOS",
        default=100,
        gt=0,
        le=100_000,
        description="Most videos one request may ask for.",
    )
    stream_poll_seconds: float = Field(
        validation_alias="MAS_STREAM_POLL_SECONDS",
        default=1.0,
        gt=0,
        le=60,
        description="How often an open event stream (`/api/v1/events`) looks for new events in the event log "
        "and for render progress: the longest an event waits before it is sent.",
    )
    stream_keepalive_seconds: float = Field(
        validation_alias="MAS_STREAM_KEEPALIVE_SECONDS",
        default=15,
        gt=0,
        le=300,
        description="An event stream with nothing to send sends a comment this often, so proxies and clients "
        "keep a quiet connection open (and a gone client is noticed).",
    )
    stream_max: int = Field(
        validation_alias="MAS_STREAM_MAX",
        default=100,
        ge=1,
        le=10_000,
        description="Event streams one `mas serve` process keeps open at once (each polls PostgreSQL and holds "
        "a Redis connection); one more is refused with 503 and Retry-After.",
    )
    event_retention_days: float = Field(
        validation_alias="MAS_EVENT_RETENTION_DAYS",
        default=7,
        gt=0,
        le=3660,
        description="How long the event log keeps an event: an hourly beat job deletes older ones, so a stream "
        "resumed after longer than this has missed them.",
    )
    flower_user: str | None = Field(
        validation_alias="MAS_FLOWER_USER", default=None, description="Flower basic-auth user."
    )
    flower_password: SecretStr | None = Field(
        validation_alias="MAS_FLOWER_PASSWORD", default=None, description="Flower basic-auth password."
    )


def check_webhook_secret(secret: str, what: str = "a webhook secret") -> str:
    """A Standard Webhooks signing secret as MAS_WEBHOOK_SECRET takes it (whsec_ + the base64 of 24 or more
    bytes), given back as it is; ValueError, naming `what` and never the value, for anything else. A user's own
    secret (`mas users set --webhook-secret`) is checked by the same rule."""
    try:
        usable = len(base64.b64decode(secret.removeprefix("whsec_"), validate=True)) >= 24
    except (binascii.Error, ValueError):
        usable = False
    if not usable:
        raise ValueError(f"{what} must be whsec_ followed by the base64 of 24 or more random bytes")
    return secret


class WebhookSettings(Group):
    """The studio-wide webhook receiver, its signing secret and its deliveries."""

    url: str | None = Field(
        validation_alias="MAS_WEBHOOK_URL",
        default=None,
        description="Studio-wide receiver of every event (batches, videos, A/B tests ready).",
    )
    secret: SecretStr | None = Field(
        validation_alias="MAS_WEBHOOK_SECRET",
        default=None,
        description="Standard Webhooks signing secret (whsec_ + base64); needed when any webhook URL is used.",
    )
    max_attempts: int = Field(
        validation_alias="MAS_WEBHOOK_MAX_ATTEMPTS",
        default=15,
        ge=1,
        le=100,
        description="Deliveries tried per event (backing off up to an hour) before it fails.",
    )
    timeout_seconds: float = Field(
        validation_alias="MAS_WEBHOOK_TIMEOUT_SECONDS",
        default=10,
        gt=0,
        le=300,
        description="How long a receiver may take.",
    )
    every_seconds: float = Field(
        validation_alias="MAS_WEBHOOK_EVERY_SECONDS",
        default=2,
        gt=0,
        description="How often beat looks for events to deliver (the first try of a new event).",
    )
    allowed_hosts: tuple[str, ...] = Field(
        validation_alias="MAS_WEBHOOK_ALLOWED_HOSTS",
        default=(),
        description="Receivers allowed where webhooks are otherwise refused (loopback, private, link-local and "
        "other non-public addresses, the studio's own services), comma-separated: a host name is allowed "
        "whatever it resolves to, a network (CIDR, 10.1.0.0/16; an address alone is one) allows the addresses "
        "in it.",
    )
    _parse_allowed_hosts = field_validator("allowed_hosts", mode="before")(comma_list)

    @field_validator("allowed_hosts")
    @classmethod
    def _check_allowed_hosts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        entries = []
        for entry in value:
            shown = entry.strip().lower().removeprefix("[").removesuffix("]")
            try:
                ipaddress.ip_network(shown, strict=False)
            except ValueError:
                shown = shown.removesuffix(".")
                if not HOST_NAME.match(shown):
                    raise ValueError(
                        f"{entry!r} is neither a host name nor a network (CIDR such as 10.1.0.0/16)"
                    ) from None
            entries.append(shown)
        return tuple(dict.fromkeys(entries))

    @model_validator(mode="after")
    def _check_secret(self) -> WebhookSettings:
        if self.url and self.secret is None:
            raise ValueError("MAS_WEBHOOK_URL needs MAS_WEBHOOK_SECRET (whsec_...): every event is signed")
        if self.secret is not None:
            check_webhook_secret(self.secret.get_secret_value(), "MAS_WEBHOOK_SECRET")
        return self
