"""The readiness topic check's rules, with a fake metadata source and clock (the broker test is in
tests/integration/test_startup_checks.py)."""

from __future__ import annotations

import logging

from aiokafka.errors import KafkaConnectionError

from kafka_scorer.config import Settings
from kafka_scorer.kafka.topic_watch import _REPEAT_S, TopicWatch, matching_partitions


def _settings(**values: object) -> Settings:
    return Settings(_env_file=None, topic_grace_s=30.0, **values)  # type: ignore[arg-type]


def test_partitions_are_counted_over_the_whole_cluster() -> None:
    cluster = {"jobs-a": 3, "jobs-b": 2, "other": 5, "__consumer_offsets": 50}
    assert matching_partitions(cluster, _settings(request_topic_pattern="jobs-.*")) == 5
    assert matching_partitions(cluster, _settings(request_topic_pattern=".*")) == 10  # internal excluded
    assert matching_partitions(cluster, _settings(request_topic_pattern="obs")) == 0  # from the start
    assert matching_partitions(cluster, _settings(request_topics=["other", "missing"])) == 5
    assert matching_partitions(cluster, _settings(request_topics=["missing"])) == 0


def test_unready_only_past_the_grace_warned_once_then_repeated_rarely(caplog) -> None:
    now = [0.0]
    watch = TopicWatch(_settings(request_topics=["missing"]), _no_cluster, clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger="kafka_scorer.kafka.topic_watch")
    watch._update(0, waited_s=29.0)
    assert watch.ready and not caplog.records
    for waited in (30.0, 35.0, 40.0):
        now[0] = waited
        watch._update(0, waited_s=waited)
    assert not watch.ready
    assert len(caplog.records) == 1
    assert "request_topics=missing exist nowhere" in caplog.records[0].getMessage()
    assert "KAFKA_SCORER_REQUEST_TOPICS" in caplog.records[0].getMessage()
    now[0] = 30.0 + _REPEAT_S
    watch._update(0, waited_s=now[0])
    assert len(caplog.records) == 2
    watch._update(2, waited_s=now[0] + 1)
    assert watch.ready and "now match 2 partition(s)" in caplog.records[-1].getMessage()


async def test_an_outage_keeps_the_last_state() -> None:
    watch = TopicWatch(_settings(), _unreachable)
    assert await watch._matched() is None
    assert watch.ready


async def _no_cluster() -> dict[str, int]:
    return {}


async def _unreachable() -> dict[str, int]:
    raise KafkaConnectionError("down")
