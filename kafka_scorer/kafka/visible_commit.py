"""Positioning a partition from the group's committed offset once it shows what this worker committed.

A transaction's offsets reach the group after the transaction coordinator answered the commit (it
writes the markers then), and aiokafka's offset fetch does not ask for stable offsets (KIP-447's
`require_stable`), so for a moment the group answers the offset before the commit. A member that
rejoined (or repositioned a partition) in that moment would read the committed records again
(worker/transaction_fence.py). Here the fetch is repeated until the group's offset reaches the floor
(or the wait ends: then the broker's answer stands, said in one line), and the partition is sought there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

log = logging.getLogger(__name__)

_RETRY_S = 0.1


async def _committed(consumer: AIOKafkaConsumer, tp: TopicPartition) -> int | KafkaError | None:
    try:
        return await consumer.committed(tp)
    except KafkaError as exc:  # a coordinator moving: asked again until the deadline
        return exc


async def seek_when_visible(
    consumer: AIOKafkaConsumer, floors: Mapping[TopicPartition, int], timeout_s: float
) -> dict[TopicPartition, int]:
    """Seek each assigned partition of `floors` to the group's committed offset once that reaches its
    floor; returns where each was sought. Nothing committed at all (a group the broker lost) is left
    to the consumer's own reset: the floor is no evidence about a log the broker no longer holds."""
    deadline = time.monotonic() + timeout_s
    sought: dict[TopicPartition, int] = {}
    for tp, floor in floors.items():
        committed = await _committed(consumer, tp)
        while (
            tp in consumer.assignment()
            and (isinstance(committed, KafkaError) or (committed is not None and committed < floor))
            and time.monotonic() < deadline
        ):
            await asyncio.sleep(_RETRY_S)
            committed = await _committed(consumer, tp)
        if tp not in consumer.assignment() or not isinstance(committed, int):
            continue
        if committed < floor:
            log.warning(
                "%s[%d]: the group's committed offset %d is still below %d, which this worker's last "
                "transaction committed, after %.0fs; reading on from the broker's answer",
                *tp,
                committed,
                floor,
                timeout_s,
            )
        consumer.seek(tp, committed)
        sought[tp] = committed
    return sought
