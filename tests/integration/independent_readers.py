"""`read_committed` readers that share no code with aiokafka: kafka-python (pure Python, its own protocol
implementation) and confluent-kafka (librdkafka, the C client most Kafka users run).

The worker and the tests' own helpers both speak Kafka through aiokafka, so an exactly-once result read
back only by aiokafka could pass on a bug the two share: how aborted transactions are skipped, where the
last stable offset sits, how control records are hidden. Each reader here assigns every partition of a
topic, starts at the beginning and keeps reading until `distinct` different job ids have come (then
`settle_s` more, for late duplicates) or the timeout passes; it returns what it read, decoded.

Both clients block, so the tests call these through `asyncio.to_thread`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable

from kafka_scorer.wire.protocol import Result, decode_result

# One record as both clients give it: its value and its headers (the content type decodes it, SPEC §3).
Raw = tuple[bytes, list[tuple[str, bytes]]]


def _decoded(raw: list[Raw]) -> list[Result]:
    return [decode_result(value, dict(headers)["content-type"].decode()) for value, headers in raw]


def _read_until(
    poll: Callable[[], list[Raw]], distinct: int, timeout_s: float, settle_s: float
) -> list[Result]:
    """Calls `poll` until the decoded records hold `distinct` ids and `settle_s` has passed since."""
    results: list[Result] = []
    deadline = time.monotonic() + timeout_s
    settled_at: float | None = None
    while time.monotonic() < deadline:
        results.extend(_decoded(poll()))
        if settled_at is None and len({r.id for r in results}) >= distinct:
            settled_at = time.monotonic()
        if settled_at is not None and time.monotonic() - settled_at >= settle_s:
            break
    return results


def read_committed_kafka_python(
    bootstrap: str, topic: str, distinct: int, timeout_s: float = 60.0, settle_s: float = 1.0
) -> list[Result]:
    """The committed results of `topic` as kafka-python reads them."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",  # no group, so nothing committed: every partition from its start
        fetch_max_wait_ms=50,
        max_partition_fetch_bytes=32 << 20,
    )
    try:
        partitions = [TopicPartition(topic, p) for p in _wait(lambda: consumer.partitions_for_topic(topic))]
        consumer.assign(partitions)

        def poll() -> list[Raw]:
            batches = consumer.poll(timeout_ms=100, max_records=1000)
            return [(r.value, list(r.headers)) for records in batches.values() for r in records]

        return _read_until(poll, distinct, timeout_s, settle_s)
    finally:
        consumer.close()


def read_committed_confluent(
    bootstrap: str, topic: str, distinct: int, timeout_s: float = 60.0, settle_s: float = 1.0
) -> list[Result]:
    """The committed results of `topic` as confluent-kafka (librdkafka) reads them."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"independent-reader-{uuid.uuid4().hex[:8]}",  # required; nothing is committed
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 50,
        }
    )
    try:

        def partitions() -> list[int]:
            found = consumer.list_topics(topic, timeout=5).topics.get(topic)
            return list(found.partitions) if found is not None and not found.error else []

        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in _wait(partitions)])

        def poll() -> list[Raw]:
            messages = consumer.consume(num_messages=1000, timeout=0.1)
            for message in messages:
                assert message.error() is None, f"confluent-kafka: {message.error()}"
            return [(m.value(), list(m.headers() or [])) for m in messages]

        return _read_until(poll, distinct, timeout_s, settle_s)
    finally:
        consumer.close()


def _wait(partitions: Callable[[], Iterable[int] | None], timeout_s: float = 10.0) -> list[int]:
    """The topic's partitions, once the client's metadata has them."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = sorted(partitions() or ())
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError("the topic has no partitions")


READERS = {"kafka-python": read_committed_kafka_python, "confluent-kafka": read_committed_confluent}
