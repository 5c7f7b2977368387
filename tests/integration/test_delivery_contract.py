"""The delivery contract of tests/worker/test_delivery.py on a real broker: the same expectations, with
the real `ResultProducer` producing to the embedded broker (tansu for at-least-once, noida-db for
exactly-once transactions) and to Apache Kafka (both modes), and the results read back from the
topics. The consumer side stays the fake that records commits: what is under test is what delivery
produces and when it lets offsets move.

A broker that refuses a topic needs ACLs, which the embedded brokers lack: those cases run on the fake
only (tests/integration/test_delivery_faults.py runs a missing topic against the real broker)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from kafka_scorer.config import Settings
from kafka_scorer.kafka.admin import create_topics
from kafka_scorer.kafka.producer import ResultProducer
from kafka_scorer.wire.protocol import Result, decode_result
from tests.integration.brokers import on_each_broker
from tests.integration.kafka_helpers import BrokerInfo, read_topic, unique
from tests.worker.conftest import TP
from tests.worker.test_delivery import DEFAULT, DeliveryContract, Harness

pytestmark = pytest.mark.integration

DEAD_LETTERS = "requests.DLT"


class SpyingProducer(ResultProducer):
    """The real producer, noting the order in which records go out (it cannot be read off two topics)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.topics: list[str] = []

    async def send(self, record) -> None:
        await super().send(record)
        self.topics.append(record.topic)

    async def send_transaction(self, records, offsets, group_id, still_ours=lambda: True) -> None:
        await super().send_transaction(records, offsets, group_id, still_ours)
        self.topics += [r.topic for r in records]


class OnBroker(DeliveryContract):
    broker: BrokerInfo

    async def harness(self, refused: dict[str, BaseException] | None = None) -> Harness:
        if refused:
            pytest.skip("refusing a topic needs broker ACLs, which the embedded brokers lack")
        # The input topic too: exactly-once commits its offsets in the transaction, and Apache Kafka
        # answers TxnOffsetCommit for a topic it does not have with UNKNOWN_TOPIC_OR_PARTITION, which
        # aiokafka retries forever (the embedded brokers accept it).
        await create_topics(self.broker.bootstrap, [DEFAULT, DEAD_LETTERS, TP.topic], 1)
        settings = Settings(_env_file=None, model="unused", bootstrap_servers=self.broker.bootstrap)  # type: ignore[call-arg]
        txn_id = unique("delivery-contract") if self.exactly_once else None
        producer = SpyingProducer(settings, transactional_id=txn_id)
        await producer.start()
        self._producers.append(producer)
        assert producer.transactional is self.exactly_once, producer.mode
        self.started_ms = int(time.time() * 1000) - 5  # results of earlier tests on these topics are older
        return Harness(exactly_once=self.exactly_once, producer=producer)

    async def results_on(self, h: Harness, topic: str, count: int) -> list[Result]:
        def mine(records) -> list:
            return [r for r in records if r.timestamp >= self.started_ms]

        timeout_s = 10.0 if count else 1.0  # none expected: a short look that something late would fail
        records = await read_topic(
            self.broker.bootstrap,
            topic,
            lambda rs: len(mine(rs)) >= max(count, 1),
            timeout_s,
            isolation_level="read_committed" if self.exactly_once else "read_uncommitted",
        )
        return [decode_result(r.value, "application/json") for r in mine(records)]

    async def topics_written(self, h: Harness) -> list[str]:
        for topic in (DEAD_LETTERS, DEFAULT):
            assert await read_topic(self.broker.bootstrap, topic, lambda rs: bool(rs), 10.0), topic
        return h.producer.topics

    @pytest.fixture(autouse=True)
    async def _producers_stop(self):
        self._producers: list[ResultProducer] = []
        yield
        for producer in self._producers:
            await producer.stop()


@on_each_broker()
class TestAtLeastOnceOnBroker(OnBroker):
    exactly_once = False

    @pytest.fixture(autouse=True)
    def _broker(self, kafka: BrokerInfo) -> None:
        self.broker = kafka


@on_each_broker("transactional_kafka")
class TestExactlyOnceOnBroker(OnBroker):
    exactly_once = True

    @pytest.fixture(autouse=True)
    def _broker(self, transactional_kafka: BrokerInfo) -> None:
        self.broker = transactional_kafka
