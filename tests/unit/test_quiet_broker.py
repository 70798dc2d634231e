"""The broker's death is quiet: workers run without gossip and mingle (nothing in the studio uses them, and gossip
logged a traceback on every worker at a Redis failover), a lost acknowledgement is one warning line, and the
visibility timeout follows the longest a gpu task may be held."""

from __future__ import annotations

import logging

import pytest
from pydantic import ValidationError

from mas.config import Settings
from mas.runtime.broker import ACK_LOGGER, use_studio_transport
from mas.runtime.processes import worker_argv


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_every_worker_runs_without_gossip_and_mingle_and_sends_events(tmp_path, kind):
    argv = worker_argv(Settings(data_dir=tmp_path), kind)
    assert {"--without-gossip", "--without-mingle", "-E"} <= set(argv)


def test_the_visibility_timeout_follows_the_longest_a_gpu_task_may_be_held_with_margin(tmp_path):
    five_minutes = Settings(data_dir=tmp_path, max_render_seconds=300, gpu_lookahead=1)
    assert five_minutes.visibility_timeout_seconds == 900  # (1 + 1) x 300 s, plus half again
    assert Settings(data_dir=tmp_path).visibility_timeout_seconds == 5400
    assert Settings(data_dir=tmp_path, visibility_timeout_seconds=4000).visibility_timeout_seconds == 4000
    with pytest.raises(ValidationError, match="MAS_GPU_LOOKAHEAD"):
        Settings(data_dir=tmp_path, max_render_seconds=300, gpu_lookahead=1, visibility_timeout_seconds=600)


def test_a_lost_acknowledgement_is_one_warning_without_a_traceback(caplog):
    use_studio_transport()
    logger = logging.getLogger(ACK_LOGGER)
    try:
        raise ConnectionError("Connection closed by server.")
    except ConnectionError as exc:
        with caplog.at_level(logging.WARNING, logger=ACK_LOGGER):
            logger.critical("Couldn't ack %r, reason:%r", 7, exc, exc_info=True)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and record.exc_info is None
    assert "visibility timeout" in record.getMessage() and "Connection closed" in record.getMessage()
    assert "Traceback" not in caplog.text
