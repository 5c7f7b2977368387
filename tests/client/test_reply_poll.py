"""The client's reply reader keeps its replies when a poll raises midway (kafka/unreadable.py).

A record aiokafka cannot parse on the reply topic (a header name that is not UTF-8, written by a raw
client) raised out of the reader's poll: the reader stopped and every waiting call ended `ClientClosed`,
and the replies drained from the partitions before it were gone with the exception. Here aiokafka's
consumer is faked to drain the other partition first, every time (tests/kafka_tests/fake_partition.py).
"""

from __future__ import annotations

from kafka_scorer.client.reply_reader import ReplyReader
from tests.kafka_tests.fake_partition import OTHER, DrainsOtherFirst
from tests.worker.conftest import TP


class _Delivered:
    """A `ReplyListener` that keeps what it is handed."""

    def __init__(self) -> None:
        self.records: list = []

    def deliver(self, record) -> None:
        self.records.append(record)


async def test_a_poll_that_raises_midway_delivers_the_other_partitions_replies_and_reads_on() -> None:
    fake = DrainsOtherFirst()
    listener = _Delivered()
    reader = ReplyReader(fake, TP.topic, listener, new_consumer=lambda: None)  # type: ignore[arg-type]
    await reader._poll()
    assert fake.read_other_from == [3], "the other partition must be read again from where the poll began"
    assert [(r.partition, r.offset) for r in listener.records] == [(1, o) for o in range(3, 9)]
    assert fake.states[TP].position == 6, "the unreadable record is skipped, not read in a loop"
    assert fake.states[OTHER].position == 9
