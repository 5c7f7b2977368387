"""A poll that raises midway hands back what it drained (kafka/unreadable.py's `PollStart`).

aiokafka drains the fetched partitions one after another and moves each one's position as it goes; an
unreadable record in a later partition raises out of the drain, and the records drained before it are
lost with the exception. CI lost the other partition's job that way in
tests/integration/test_poison.py whenever its partition was drained first (the order depends on how
the fetch responses arrived, so the integration test only failed now and then). Here aiokafka's
consumer is faked to drain `OTHER` first, every time.
"""

from __future__ import annotations

from types import SimpleNamespace

from aiokafka import TopicPartition

from kafka_scorer.kafka.consumer import JobConsumer
from kafka_scorer.kafka.unreadable import PollStart
from tests.kafka_tests.fake_partition import Connection, FetchStateFake
from tests.worker.conftest import TP, settings

OTHER = TopicPartition("requests", 1)
BAD_HEADER = UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")


class _Drains:
    """Two partitions: `TP` holds an unreadable record at its position, `OTHER` six readable ones from
    offset 3. A poll of both drains `OTHER` first (its position moves to 9) and then raises on `TP`, as
    aiokafka's drain does; a poll of one partition reads that partition alone."""

    def __init__(self) -> None:
        self.states = {TP: FetchStateFake(5, highwater=6), OTHER: FetchStateFake(3, highwater=9)}
        self._subscription = SimpleNamespace(subscription=SimpleNamespace(assignment=self._assignment()))
        self.rejoins = 0
        self._coordinator = SimpleNamespace(
            generation=1, _coordination_task=None, request_rejoin=self._request_rejoin
        )
        cluster = SimpleNamespace(leader_for_partition=lambda tp: 1)
        self._client = SimpleNamespace(cluster=cluster, _conns={(1, 0): Connection()})
        self.paused_tps: set[TopicPartition] = set()
        self.read_other_from: list[int] = []

    def _assignment(self) -> SimpleNamespace:
        return SimpleNamespace(tps=[TP, OTHER], active=True, state_value=lambda tp: self.states[tp])

    def _request_rejoin(self) -> None:
        self.rejoins += 1

    async def getmany(self, *partitions: TopicPartition, timeout_ms: int, max_records: int):
        if not partitions:  # the whole poll: OTHER (positioned if it was not) drained, then TP breaks it
            self.states[OTHER].has_valid_position = True
            self.states[OTHER].position = 9
            raise BAD_HEADER
        (tp,) = partitions
        if tp == TP:
            raise BAD_HEADER
        start = self.states[OTHER].position
        self.read_other_from.append(start)
        self.states[OTHER].position = 9
        return {OTHER: [SimpleNamespace(topic=OTHER.topic, partition=1, offset=o) for o in range(start, 9)]}

    async def position(self, tp: TopicPartition) -> int:
        return self.states[tp].position

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.states[tp].position = offset

    async def committed(self, tp: TopicPartition) -> int | None:
        return None  # a new group: the reset policy (earliest) places it

    async def seek_to_beginning(self, tp: TopicPartition) -> None:
        self.states[tp].position = 0

    def assignment(self) -> set[TopicPartition]:
        return set(self._subscription.subscription.assignment.tps)

    def paused(self) -> set[TopicPartition]:
        return set(self.paused_tps)

    def pause(self, *tps: TopicPartition) -> None:
        self.paused_tps |= set(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self.paused_tps -= set(tps)

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.states[tp].highwater


async def test_the_records_a_failed_poll_drained_are_read_again_not_skipped() -> None:
    fake = _Drains()
    consumer = JobConsumer(settings())
    consumer._consumer = fake  # type: ignore[assignment]
    got = await consumer.fetch(10, 100)
    assert fake.read_other_from == [3], "OTHER must be read again from where the failed poll began"
    assert [r.offset for r in got[OTHER]] == [3, 4, 5, 6, 7, 8]
    assert [(r.offset, "UTF-8" in r.reason) for r in got[TP]] == [(5, True)]  # the unreadable one, answered
    assert fake.rejoins == 0


def test_a_poll_that_moved_nothing_hands_nothing_back() -> None:
    fake = _Drains()
    start = PollStart.of(fake, seeks=0)  # type: ignore[arg-type]
    assert start.hand_back(fake, seeks=0) == set()  # type: ignore[arg-type]
    assert {tp: s.position for tp, s in fake.states.items()} == {TP: 5, OTHER: 3}


def test_a_partition_whose_start_is_unknown_is_positioned_afresh() -> None:
    """A rebalance or a seek while the poll waited (every partition), or a partition's first position
    meanwhile (that one): where its drained records began cannot be told, so it is handed to the
    log-reset path, which positions it from the broker and restarts its watermark."""
    for change, unplaced in (("rebalance", {TP, OTHER}), ("seek", {TP, OTHER}), ("first position", {OTHER})):
        fake = _Drains()
        if change == "first position":
            fake.states[OTHER].has_valid_position = False
        start = PollStart.of(fake, seeks=0)  # type: ignore[arg-type]
        fake.states[OTHER].position, fake.states[OTHER].has_valid_position = 9, True
        if change == "rebalance":
            fake._subscription.subscription.assignment = fake._assignment()
        assert start.hand_back(fake, seeks=1 if change == "seek" else 0) == unplaced, change  # type: ignore[arg-type]


async def test_an_unplaced_partition_waits_paused_until_it_is_positioned_from_the_broker() -> None:
    fake = _Drains()
    fake.states[OTHER].has_valid_position = False  # the first poll after the assignment
    consumer = JobConsumer(settings())
    consumer._consumer = fake  # type: ignore[assignment]
    got = await consumer.fetch(10, 100)
    assert OTHER not in got and fake.read_other_from == [], "read on from an unknown start"
    consumer.resume()  # backpressure lifting meanwhile must not reopen it
    assert OTHER in fake.paused_tps
    verdicts = await consumer.reposition_reset_logs()
    assert set(verdicts.reset) == {OTHER} and fake.states[OTHER].position == 0  # committed: none, earliest
