"""A poll that raises midway: what it drained handed back (`PollStart`), and a poll that aiokafka cannot
parse read around the record that breaks it (`read_around_unreadable`).

aiokafka raises while parsing a fetched batch whose header name is not UTF-8, and the whole poll is
lost: without this the worker would die on it, restart, read it again and die again. So each fetchable
partition is polled alone, so the healthy ones keep their records and the poisoned one is found; its
position is the unreadable offset (the records before it come back one poll at a time, as usual), which
gets an `Unreadable` stand-in (answered `invalid_message` by the worker) and is skipped. aiokafka reads a
batch from its start, so later records of the same producer batch are unreadable too: they are answered
one by one on the next polls, none is skipped unanswered.

A rebalance may revoke any partition meanwhile: only what is still assigned is paused, resumed or
sought (positioning.py), and a partition revoked, or revoked and assigned again, is left to its next
assignment's position.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import IllegalStateError

from kafka_scorer.kafka.positioning import held
from kafka_scorer.kafka.records import Unreadable
from kafka_scorer.kafka.subscription import assignment_of, positions

log = logging.getLogger(__name__)

Polled = dict[TopicPartition, list[ConsumerRecord | Unreadable]]


async def read_around_unreadable(consumer: AIOKafkaConsumer, timeout_ms: int, max_records: int) -> Polled:
    """The poll again, one fetchable partition at a time, with a stand-in for the record that broke it."""
    fetchable = set(consumer.assignment()) - set(consumer.paused())
    out: Polled = {}
    consumer.pause(*fetchable)
    try:
        for tp in sorted(fetchable):
            _only_assigned(consumer, consumer.resume, tp)
            try:
                got = await consumer.getmany(tp, timeout_ms=timeout_ms, max_records=max_records)
                out.update(got)
            except UnicodeDecodeError:
                out[tp] = await _read_up_to_unreadable(consumer, tp, timeout_ms, max_records)
            finally:
                _only_assigned(consumer, consumer.pause, tp)
    finally:
        live = fetchable & set(consumer.assignment())
        if live:
            consumer.resume(*live)
    return out


def _only_assigned(consumer: AIOKafkaConsumer, change: Callable[..., None], tp: TopicPartition) -> None:
    """Pause or resume `tp` only while it is still assigned (aiokafka raises on any other)."""
    if tp in consumer.assignment():
        change(tp)


async def _read_up_to_unreadable(
    consumer: AIOKafkaConsumer, tp: TopicPartition, timeout_ms: int, max_records: int
) -> list[ConsumerRecord | Unreadable]:
    """One record at a time (aiokafka hands out the readable head of a batch), up to the one it cannot
    parse, which gets its stand-in and is skipped."""
    records: list[ConsumerRecord | Unreadable] = []
    while len(records) < max_records:
        try:
            got = await consumer.getmany(tp, timeout_ms=timeout_ms, max_records=1)
        except UnicodeDecodeError as exc:
            holding = held(consumer, tp)
            try:
                offset = await consumer.position(tp)
            except IllegalStateError:
                return records  # revoked: the record is its next owner's to read
            if holding is None or not holding.still(consumer):
                return records  # revoked and assigned again meanwhile: positioned afresh
            reason = f"its batch holds a header name that is not UTF-8 ({exc.reason})"
            log.error("consumer: %s[%d] offset %d unreadable (%s); skipped", *tp, offset, reason)
            consumer.seek(tp, offset + 1)
            return [*records, Unreadable(tp.topic, tp.partition, offset, reason)]
        if not got:
            break
        records.extend(got.get(tp, []))
    return records


@dataclass(frozen=True)
class PollStart:
    """Where each partition's reading stood when a poll began, for the poll that raises midway.

    aiokafka drains the fetched partitions one after another, moving each one's position as it goes;
    a record it cannot parse raises out of the drain, and the records of the partitions drained before
    it are lost with the exception while their positions stay moved on. Read on from there, the worker
    skipped them, and its commits passed them (the other partition's job in
    tests/integration/test_poison.py, lost whenever its partition came first). So every poll starts
    from a `PollStart`, and one that raises hands the drained records back."""

    assignment: Any
    positions: dict[TopicPartition, int]
    seeks: int
    """How many seeks the consumer's own other tasks had made (`JobConsumer`): one made while the poll
    waited moves a position with no record handed out."""

    @classmethod
    def of(cls, consumer: AIOKafkaConsumer, seeks: int) -> PollStart:
        return cls(assignment_of(consumer), positions(consumer), seeks)

    def hand_back(self, consumer: AIOKafkaConsumer, seeks: int) -> set[TopicPartition]:
        """Seek each partition the failed poll moved back to where the poll began; the partitions whose
        starting point is not known (a rebalance or a seek came while the poll waited, or a partition
        got its first position meanwhile) are returned: they must be positioned from the broker and
        their watermarks restarted, as after a log reset (consumer.py, worker/rebalance.py)."""
        now = positions(consumer)
        if assignment_of(consumer) is not self.assignment or seeks != self.seeks:
            return set(now)
        for tp, offset in self.positions.items():
            if now.get(tp, offset) > offset:
                log.warning(
                    "consumer: %s[%d] records %d-%d were handed out by a poll that failed; read again",
                    *tp,
                    offset,
                    now[tp] - 1,
                )
                consumer.seek(tp, offset)
        return set(now) - set(self.positions)
