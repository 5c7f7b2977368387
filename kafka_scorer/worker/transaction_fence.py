"""An exactly-once transaction commits only under the group membership its offsets were taken in.

Kafka fences a transaction of a lost generation at the broker when the producer sends the consumer's
generation with its offsets (KIP-447, TxnOffsetCommit v3). aiokafka 0.14 sends version 0, without one,
so the broker accepts the offsets of a member that has since lost its partitions. Seen on the three-node
cluster (issue 45): the node coordinating the group and the transactions was killed; the worker lost its
membership, rejoined with the same partitions and read them again from the committed offset 63 while
its old transaction (offsets 63-64) waited for the coordinator to move; that transaction then committed,
and the re-read answered the same records again in the next one: three jobs twice under read_committed.

So the worker fences its own transactions, in three steps:
- a `Claim` is taken with each transaction's offsets (the membership, and the watermarks of the
  partitions it answers); right before the commit the claim must still hold (same membership, no
  watermark closed by a revoke, a lost membership, a log reset or a rewind), else the transaction is
  aborted (kafka/producer.py `StaleTransaction`);
- a lost membership waits for the transaction in flight to end (committed or aborted) before the
  member rejoins (worker/rebalance.py), so the new assignment is positioned after it, never beside it;
- a transaction that did commit may not be visible yet: Kafka writes its offsets to the group after
  answering the commit, and aiokafka's offset fetch (no `require_stable`, KIP-447) answers the older
  offset meanwhile. `Floors` remembers what this worker's transactions committed; a partition assigned
  again (or repositioned) is positioned only once the group's committed offset has reached it (within
  `VISIBLE_WAIT_S`, after which the broker's own answer stands), so a committed offset never moves back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kafka_scorer.kafka.fenced_commit import Membership
from kafka_scorer.kafka.offsets import Watermark
from kafka_scorer.kafka.records import TopicPartition

VISIBLE_WAIT_S = 15.0
"""How long a re-assigned partition waits for this worker's last committed transaction to show in the
group's offsets: about a coordinator's failover (the markers are written once the new one loaded)."""


@dataclass(frozen=True)
class Claim:
    """What one transaction's offsets were taken under."""

    membership: Membership | None
    marks: tuple[Watermark, ...]

    def holds(self, membership_now: Callable[[], Membership | None]) -> Callable[[], bool]:
        """The check made right before the commit: the membership unchanged and no partition closed."""

        def still_ours() -> bool:
            now = membership_now()
            return now is not None and now == self.membership and not any(m.closed for m in self.marks)

        return still_ours


def claim(membership: Membership | None, tickets: Iterable[Any]) -> Claim:
    """The claim of a transaction answering `tickets` (each with its partition's `watermark`)."""
    marks: dict[int, Watermark] = {id(t.watermark): t.watermark for t in tickets}
    return Claim(membership, tuple(marks.values()))


class Floors:
    """The offsets this worker's transactions committed, per partition: the least a re-read may start at
    once the group shows them."""

    def __init__(self) -> None:
        self._committed: dict[TopicPartition, int] = {}

    def committed(self, offsets: dict[TopicPartition, int]) -> None:
        for tp, offset in offsets.items():
            self._committed[tp] = max(offset, self._committed.get(tp, offset))

    def of(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self._committed[tp] for tp in partitions if tp in self._committed}
