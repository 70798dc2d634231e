"""The studio's Redis transport: kombu's, with one fault survived.

When Redis goes away, Celery's consumer closes the broken connection before it reconnects; closing a channel
restores its unacknowledged messages, which needs a Redis client, and kombu builds that client from the
connection's parameters, which the close has already dropped: an `AttributeError` that Celery treats as
unrecoverable, and the worker exits. Here that case is a connection error, which Celery's close ignores: the
worker reconnects, and the messages stay in Redis's unacked set, which Redis hands back after the visibility
timeout (a step delivered again finds its lease or its committed work and does nothing twice). An
acknowledgement lost that way is logged as one warning (`LostAcknowledgement`), not a CRITICAL traceback.
"""

from __future__ import annotations

import logging

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


class LostAcknowledgement(logging.Filter):
    """An acknowledgement that met a broker going away (a Redis master's death) is expected: one warning line
    saying what follows, not a CRITICAL traceback. Redis hands the task back after the visibility timeout, and
    a step delivered again finds its work done."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith(("Couldn't ack", "Couldn't reject")):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg += " (the broker's connection was lost: Redis hands the task back after the visibility timeout)"
            record.exc_info, record.exc_text = None, None
        return True


ACK_LOGGER = "celery.worker.request"
"""The logger a worker's failed acknowledgements are logged on (kombu's `Message.ack_log_error`)."""


def use_studio_transport() -> None:
    """Make the `redis://`, `rediss://`, `redis+socket://` and `sentinel://` broker URLs use these transports
    (kombu resolves a URL's scheme through its alias table), and log a lost acknowledgement as one line."""
    for alias, transport in ALIASES.items():
        TRANSPORT_ALIASES[alias] = f"{__name__}:{transport}"
    logger = logging.getLogger(ACK_LOGGER)
    if not any(isinstance(f, LostAcknowledgement) for f in logger.filters):
        logger.addFilter(LostAcknowledgement())
