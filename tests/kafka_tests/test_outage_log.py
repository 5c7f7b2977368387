"""The outage watch and the client-noise filter with a clock and a probe of our own: which lines pass,
what they count, and when readiness turns red and green again."""

from __future__ import annotations

import logging

import pytest
from aiokafka.errors import KafkaError

from kafka_scorer.kafka.outage import BrokerWatch, ClientNoise


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _client_error(noise: ClientNoise, text: str = "Unable connect to node with id 1: refused") -> bool:
    record = logging.LogRecord("aiokafka.conn", logging.ERROR, __file__, 1, text, None, None)
    return noise.filter(record)


def test_connection_errors_pass_once_a_minute_with_a_count() -> None:
    clock = _Clock()
    noise = ClientNoise(clock=clock)
    assert _client_error(noise)
    assert [_client_error(noise) for _ in range(500)] == [False] * 500
    clock.now = 61
    record = logging.LogRecord("aiokafka", logging.ERROR, __file__, 1, "Unable connect to %s", ("x",), None)
    assert noise.filter(record)
    assert record.levelname == "WARNING" and "(500 similar lines held back" in record.getMessage()
    other = logging.LogRecord("aiokafka", logging.ERROR, __file__, 1, "something else entirely", None, None)
    assert noise.filter(other), "only connection trouble is held back while no outage is known"


async def test_two_failed_probes_are_an_outage_until_one_answers(caplog: pytest.LogCaptureFixture) -> None:
    clock = _Clock()
    answers: list[BaseException | None] = [KafkaError("down")] * 40 + [None]

    async def probe() -> None:
        answer = answers.pop(0)
        if answer is not None:
            raise answer

    watch = BrokerWatch("kafka-1:9092", probe, ClientNoise(clock=clock), clock)
    caplog.set_level(logging.INFO, logger="kafka_scorer")
    await watch.check()
    assert watch.ready, "one failed request is not an outage yet"
    for _ in range(39):
        await watch.check()
        assert not watch.ready and watch.noise.quiet
        assert not _client_error(watch.noise, "Failed fetch messages from 1: anything at all")
        clock.now += 2
    await watch.check()
    assert watch.ready and not watch.noise.quiet
    lines = [r.getMessage() for r in caplog.records if r.name == "kafka_scorer.kafka.outage"]
    assert len(lines) == 3, lines  # the outage, one reminder after a minute, the recovery
    assert "kafka-1:9092 unreachable" in lines[0] and "no restart needed" in lines[0]
    assert "still unreachable after 60s" in lines[1]
    assert "reachable again after 78s" in lines[2] and "held back" in lines[2]
