"""The webhook outbox's rules that need no receiver: the backoff between deliveries, and a signing secret
refused when the settings are read. Pure code."""

from __future__ import annotations

import base64

import pytest

from mas.outbox import webhooks

SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()


def test_backoff_doubles_from_two_seconds_up_to_an_hour():
    for attempts, low, high in ((1, 1.6, 2.0), (2, 3.2, 4.0), (5, 25.6, 32.0), (12, 2880, 3600), (99, 2880, 3600)):
        assert low <= webhooks.backoff_seconds(attempts) <= high


def test_a_signing_secret_that_cannot_sign_is_refused_when_the_settings_are_read():
    from pydantic import ValidationError

    from mas.config import Settings

    for bad in ("whsec_not*base64", "whsec_" + base64.b64encode(b"short").decode()):
        with pytest.raises(ValidationError, match="MAS_WEBHOOK_SECRET"):
            Settings(webhook_secret=bad)
    with pytest.raises(ValidationError, match="needs MAS_WEBHOOK_SECRET"):
        Settings(webhook_url="http://127.0.0.1:9/hook")
    assert Settings(webhook_secret=SECRET).webhooks.secret is not None
