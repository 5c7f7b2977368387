"""Positioning a partition from the broker while a rebalance takes it away (issue 45): a revoked partition
is dropped, never sought, and nothing raises. aiokafka's consumer is faked down to its assignment; the
real broker runs this in tests/integration/test_topics_recreated_late.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from aiokafka import TopicPartition
from aiokafka.errors import IllegalStateError

from kafka_scorer.kafka.positioning import Positioner

TP = TopicPartition("requests", 1)


class _Assignment:
    def __init__(self, tps: set[TopicPartition]) -> None:
        self.tps = tps
        self.active = True


class _Consumer:
    """A committed-offset request during which the group takes the partition away, as the missing topics
    made it do; every seek on an unassigned partition raises, as aiokafka's does."""

    def __init__(self, committed: int | None, revoke_during: str = "", log_end: int = 10) -> None:
        self._committed = committed
        self.log_end = log_end  # what ListOffsets answers now
        self.revoke_during = revoke_during
        self._subscription = SimpleNamespace(subscription=SimpleNamespace(assignment=_Assignment({TP})))
        self.sought: list[tuple[TopicPartition, object]] = []

    def revoke(self) -> None:
        old = self._subscription.subscription.assignment
        old.active = False
        self._subscription.subscription.assignment = _Assignment(set())

    def _check(self, tp: TopicPartition) -> None:
        if tp not in self._subscription.subscription.assignment.tps:
            raise IllegalStateError(f"Partitions {{{tp}}} are not assigned")

    async def committed(self, tp: TopicPartition) -> int | None:
        await asyncio.sleep(0)
        if self.revoke_during == "committed":
            self.revoke()
        return self._committed

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.log_end for tp in tps}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._check(tp)
        self.sought.append((tp, offset))

    async def seek_to_beginning(self, tp: TopicPartition) -> bool:
        self._check(tp)
        if self.revoke_during == "reset":
            self.revoke()
            return False
        self.sought.append((tp, "earliest"))
        return True


async def test_a_partition_revoked_while_its_committed_offset_is_read_is_dropped_not_sought() -> None:
    for committed in (5, None):  # the committed offset, and the reset that used to follow it
        fake = _Consumer(committed, revoke_during="committed")
        positioned = await Positioner(fake, "earliest").from_broker(TP, within=10, settle_s=0.0)  # type: ignore[arg-type]
        assert positioned is False
        assert fake.sought == []


async def test_a_partition_revoked_during_the_reset_seek_is_dropped() -> None:
    fake = _Consumer(None, revoke_during="reset")
    assert await Positioner(fake, "earliest").from_broker(TP) is False  # type: ignore[arg-type]


async def test_a_partition_still_held_is_positioned_from_the_committed_offset_else_the_reset() -> None:
    fake = _Consumer(7)
    assert await Positioner(fake, "earliest").from_broker(TP, within=10) is True  # type: ignore[arg-type]
    assert fake.sought == [(TP, 7)]
    fake = _Consumer(70)  # beyond the log end, which never reaches it: an older log's offset
    assert await Positioner(fake, "earliest").from_broker(TP, within=10) is True  # type: ignore[arg-type]
    assert fake.sought == [(TP, "earliest")]


async def test_a_committed_offset_above_a_lagging_log_end_is_kept_once_the_end_catches_up() -> None:
    """After a leader failover the reported end (10) trails the committed offset (12) for a moment; the
    broker's log end reaches it, so the partition reads on from 12, not again from the earliest."""
    fake = _Consumer(12, log_end=12)
    assert await Positioner(fake, "earliest").from_broker(TP, within=10) is True  # type: ignore[arg-type]
    assert fake.sought == [(TP, 12)]


async def test_a_partition_not_assigned_at_all_is_left_alone() -> None:
    fake = _Consumer(3)
    fake.revoke()
    assert await Positioner(fake, "earliest").from_broker(TP) is False  # type: ignore[arg-type]
    assert fake.sought == []


async def test_a_committed_offset_that_never_comes_falls_back_to_the_reset_in_bounded_time() -> None:
    fake = _Consumer(3)

    async def never(tp: TopicPartition) -> int | None:
        await asyncio.sleep(60)
        return 3

    fake.committed = never  # type: ignore[method-assign]
    assert await Positioner(fake, "earliest").from_broker(TP, wait_s=0.05) is True  # type: ignore[arg-type]
    assert fake.sought == [(TP, "earliest")]
