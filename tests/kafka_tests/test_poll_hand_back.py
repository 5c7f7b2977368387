"""A poll that raises midway hands back what it drained (kafka/unreadable.py's `PollStart`).

aiokafka drains the fetched partitions one after another and moves each one's position as it goes; an
unreadable record in a later partition raises out of the drain, and the records drained before it are
lost with the exception. CI lost the other partition's job that way in
tests/integration/test_poison.py whenever its partition was drained first (the order depends on how
the fetch responses arrived, so the integration test only failed now and then). Here aiokafka's
consumer is faked to drain `OTHER` first, every time.
"""

from __future__ import annotations

from kafka_scorer.kafka.consumer import JobConsumer
from kafka_scorer.kafka.unreadable import PollStart
from tests.kafka_tests.fake_partition import OTHER, DrainsOtherFirst
from tests.worker.conftest import TP, settings


async def test_the_records_a_failed_poll_drained_are_read_again_not_skipped() -> None:
    fake = DrainsOtherFirst()
    consumer = JobConsumer(settings())
    consumer._consumer = fake  # type: ignore[assignment]
    got = await consumer.fetch(10, 100)
    assert fake.read_other_from == [3], "OTHER must be read again from where the failed poll began"
    assert [r.offset for r in got[OTHER]] == [3, 4, 5, 6, 7, 8]
    assert [(r.offset, "UTF-8" in r.reason) for r in got[TP]] == [(5, True)]  # the unreadable one, answered
    assert fake.rejoins == 0


def test_a_poll_that_moved_nothing_hands_nothing_back() -> None:
    fake = DrainsOtherFirst()
    start = PollStart.of(fake, seeks=0)  # type: ignore[arg-type]
    assert start.hand_back(fake, seeks=0) == set()  # type: ignore[arg-type]
    assert {tp: s.position for tp, s in fake.states.items()} == {TP: 5, OTHER: 3}


def test_a_partition_whose_start_is_unknown_is_positioned_afresh() -> None:
    """A rebalance or a seek while the poll waited (every partition), or a partition's first position
    meanwhile (that one): where its drained records began cannot be told, so it is handed to the
    log-reset path, which positions it from the broker and restarts its watermark."""
    for change, unplaced in (("rebalance", {TP, OTHER}), ("seek", {TP, OTHER}), ("first position", {OTHER})):
        fake = DrainsOtherFirst()
        if change == "first position":
            fake.states[OTHER].has_valid_position = False
        start = PollStart.of(fake, seeks=0)  # type: ignore[arg-type]
        fake.states[OTHER].position, fake.states[OTHER].has_valid_position = 9, True
        if change == "rebalance":
            fake._subscription.subscription.assignment = fake._assignment()
        assert start.hand_back(fake, seeks=1 if change == "seek" else 0) == unplaced, change  # type: ignore[arg-type]


async def test_an_unplaced_partition_waits_paused_until_it_is_positioned_from_the_broker() -> None:
    fake = DrainsOtherFirst()
    fake.states[OTHER].has_valid_position = False  # the first poll after the assignment
    consumer = JobConsumer(settings())
    consumer._consumer = fake  # type: ignore[assignment]
    got = await consumer.fetch(10, 100)
    assert OTHER not in got and fake.read_other_from == [], "read on from an unknown start"
    consumer.resume()  # backpressure lifting meanwhile must not reopen it
    assert OTHER in fake.paused_tps
    verdicts = await consumer.reposition_reset_logs()
    assert set(verdicts.reset) == {OTHER} and fake.states[OTHER].position == 0  # committed: none, earliest
