"""A poll that aiokafka cannot parse, read around the record that breaks it.

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

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import IllegalStateError

from kafka_scorer.kafka.positioning import held
from kafka_scorer.kafka.records import Unreadable

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
