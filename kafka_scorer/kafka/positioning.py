"""Positioning a partition from what the broker holds, safe against the rebalance that may take it away
meanwhile.

Reading the group's committed offset is a request to the broker, and so is a seek to the earliest or
latest offset: while either is under way, a rebalance can revoke the partition. That is what happens when
a broker comes back empty with the topics not yet recreated (issue 45): the worker repositions every
partition (kafka/log_reset.py, a new connection is a new log), the topics are missing from the metadata,
the group takes all partitions away, and aiokafka's seek on a partition no longer assigned raises
`IllegalStateError` — which ended the worker.

So every seek is made only while the partition is still held under the very assignment it was started
in (aiokafka makes a new assignment object at every rebalance): a partition revoked meanwhile is
*dropped*, not reset. Its next assignment, to this member or another, is positioned by aiokafka from the
group's committed offset, and its watermark was closed with the revocation (worker/rebalance.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import IllegalStateError, KafkaError

from kafka_scorer.kafka.lagging_end import end_reaches
from kafka_scorer.kafka.subscription import assignment_of

log = logging.getLogger(__name__)

_COMMITTED_RETRY_S = 0.25


@dataclass(frozen=True)
class Held:
    """A partition as one assignment holds it: seeks on it count only while that assignment lasts."""

    tp: TopicPartition
    assignment: Any  # aiokafka's Assignment: compared by identity, a rebalance makes a new one

    def still(self, consumer: AIOKafkaConsumer) -> bool:
        now = assignment_of(consumer)
        return now is self.assignment and now.active and self.tp in now.tps


def held(consumer: AIOKafkaConsumer, tp: TopicPartition) -> Held | None:
    """The partition under the consumer's current assignment; None when it is not assigned now."""
    assignment = assignment_of(consumer)
    if assignment is None or not assignment.active or tp not in assignment.tps:
        return None
    return Held(tp, assignment)


@dataclass
class Positioner:
    """Seeks that drop a revoked partition instead of raising out of the poll loop."""

    consumer: AIOKafkaConsumer
    auto_offset_reset: str

    async def from_broker(
        self,
        tp: TopicPartition,
        within: int | None = None,
        settle_s: float = 0.0,
        wait_s: float | None = None,
    ) -> bool:
        """To the group's committed offset, else as `auto_offset_reset` says; a committed offset beyond
        `within` (the log end), once the end has had its moment to catch up, belongs to an older log and
        is not trusted. False: the partition was not
        (or no longer) assigned, and nothing was sought.

        `settle_s`: how long "nothing committed" is asked again before it is believed. Right after a
        restart Apache Kafka answers an offset fetch while it still loads the group's offsets with a
        response-level error that aiokafka 0.14 does not read, so the partition reads as never committed
        (seen here: one partition of three, committed at 30, answered -1), and the worker would read it
        again from the start. `wait_s`: the longest the committed offset is waited for (the poll loop
        must not hang on it); past it, or on a broker error, the partition is positioned as
        `auto_offset_reset` says, which never skips either."""
        holding = held(self.consumer, tp)
        if holding is None:
            return False
        try:
            committed = await asyncio.wait_for(self._committed(tp, settle_s), wait_s)
        except (KafkaError, TimeoutError) as exc:
            log.warning(
                "%s[%d]: the group's committed offset could not be read (%r); positioned at the %s offset",
                *tp,
                exc,
                self.auto_offset_reset,
            )
            committed = None
        if committed is not None and within is not None and committed > within:
            # right after a leader failover the new leader's log end trails for a moment: a committed
            # offset above it is waited for (kafka/lagging_end.py) before it is taken for an older log's
            within = committed if await end_reaches(self.consumer, tp, committed) else within
        if not holding.still(self.consumer):
            return False
        if committed is not None and (within is None or committed <= within):
            self.consumer.seek(tp, committed)
            return True
        return await self.reset(holding)

    async def reset(self, holding: Held) -> bool:
        """To the earliest or latest offset (`auto_offset_reset`) while `holding` lasts; False when the
        partition was revoked first (aiokafka's own wait ends with the assignment, so does this)."""
        if not holding.still(self.consumer):
            return False
        try:
            if self.auto_offset_reset == "earliest":
                await self.consumer.seek_to_beginning(holding.tp)
            else:
                await self.consumer.seek_to_end(holding.tp)
        except IllegalStateError:  # revoked between the check and aiokafka's own: the same, dropped
            return False
        return holding.still(self.consumer)

    async def _committed(self, tp: TopicPartition, settle_s: float) -> int | None:
        committed = await self.consumer.committed(tp)
        deadline = time.monotonic() + settle_s
        while committed is None and time.monotonic() < deadline:
            await asyncio.sleep(_COMMITTED_RETRY_S)
            committed = await self.consumer.committed(tp)
        return committed
