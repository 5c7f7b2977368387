"""aiokafka's missing-topic flood (issue 45: 1,447 ERROR lines in 20 s) said once, in the worker's words."""

from __future__ import annotations

import logging

import pytest

from kafka_scorer.kafka.missing_topics import CLIENT_LOGGER, MISSING, QUIET_S, MissingTopics, waits_for
from tests.worker.conftest import settings


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _flood(times: int, clock: _Clock, step_s: float = 0.014) -> None:
    client = logging.getLogger(CLIENT_LOGGER)
    for _ in range(times):
        client.error(MISSING, "s4.requests")
        clock.now += step_s


def test_a_flood_of_missing_topic_lines_is_one_warning_saying_what_the_worker_waits_for(caplog) -> None:
    caplog.set_level(logging.INFO)
    clock = _Clock()
    noise = MissingTopics(
        waits_for(settings(request_topics=["s4.requests"], reply_topic="s4.replies")), clock
    )
    noise.install()
    try:
        _flood(1_447, clock)
        said = [r for r in caplog.records if r.name == CLIENT_LOGGER]
        assert len(said) == 1
        assert said[0].levelno == logging.WARNING
        text = said[0].getMessage()
        assert (
            "s4.requests" in text and "waits for its request topics" in text and "resumes by itself" in text
        )
        assert noise.held_back == 1_446
        clock.now += QUIET_S  # the topics came back; a later episode is said again, with the count
        _flood(3, clock)
        said = [r.getMessage() for r in caplog.records if r.name == CLIENT_LOGGER]
        assert len(said) == 2 and "1446 such lines held back" in said[1]
    finally:
        noise.remove()


@pytest.mark.parametrize("line", ["Topic %s is not authorized for this client", "other %s"])
def test_other_client_lines_pass_untouched(caplog, line) -> None:
    noise = MissingTopics("waits", _Clock())
    noise.install()
    try:
        logging.getLogger(CLIENT_LOGGER).error(line, "t")
    finally:
        noise.remove()
    assert [r.levelno for r in caplog.records if r.name == CLIENT_LOGGER] == [logging.ERROR]
