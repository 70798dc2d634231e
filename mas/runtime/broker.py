"""The studio's Redis transport: kombu's, with one fault survived.

When Redis goes away, Celery's consumer closes the broken connection before it reconnects; closing a channel
restores its unacknowledged messages, which needs a Redis client, and kombu builds that client from the
connection's parameters, which the close has already dropped: an `AttributeError` that Celery treats as
unrecoverable, and the worker exits. Here that case is a connection error, which Celery's close ignores: the
worker reconnects, and the messages stay in Redis's unacked set, which Redis hands back after the visibility
timeout (a step delivered again finds its lease or its committed work and does nothing twice).
"""

from __future__ import annotations

import redis
from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis

ALIASES = {"redis": "Transport", "rediss": "Transport", "sentinel": "SentinelTransport"}


class _ReconnectsAfterClose:
    def _connparams(self, asynchronous: bool = False) -> dict:
        if self.connection.client is None:  # type: ignore[attr-defined]
            raise redis.ConnectionError("the broker connection was closed; reconnecting")
        return super()._connparams(asynchronous)  # type: ignore[misc]


class Channel(_ReconnectsAfterClose, kombu_redis.Channel):
    pass


class Transport(kombu_redis.Transport):
    Channel = Channel


class SentinelChannel(_ReconnectsAfterClose, kombu_redis.SentinelChannel):
    """kombu's Sentinel channel (each new connection goes to the master the Sentinels name then), with the fault
    above survived too."""


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel


def use_studio_transport() -> None:
    """Make the `redis://`, `rediss://`, `redis+socket://` and `sentinel://` broker URLs use these transports
    (kombu resolves a URL's scheme through its alias table)."""
    for alias, transport in ALIASES.items():
        TRANSPORT_ALIASES[alias] = f"{__name__}:{transport}"
