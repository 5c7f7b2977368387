"""Per-partition commit watermarks over results that finish out of order (SPEC §7).

A record's offset may be committed only when it and every record before it in its partition has been
answered. Jobs of one partition finish out of order (a short job overtakes a long one in the next
batch), so each partition keeps its received offsets and the watermark is the lowest
one not yet answered. Offsets need not be contiguous (compaction, transaction markers): the watermark
jumps over offsets that were never received.

A `Watermark` belongs to one assignment of its partition. When the partition is revoked its watermark
is closed: completions that arrive later (a batch that was already on the device) no longer move any
commit, so a late result can never commit past work that the partition's next owner has to redo.
Pure Python, no Kafka client: unit-tested in tests/kafka_tests/test_offsets.py.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable
from typing import Generic, TypeVar

P = TypeVar("P")  # a partition key: aiokafka's TopicPartition in the worker, anything hashable in tests


class Watermark:
    """Received-but-unanswered offsets of one partition, for one assignment of it."""

    __slots__ = ("_done", "_next", "_open", "_pending", "closed", "committed", "repeats")

    def __init__(self, committed: int | None = None) -> None:
        self._pending: list[int] = []  # received offsets not yet passed by the commit: a min-heap
        self._done: Counter[int] = Counter()  # answered offsets still behind an unanswered one
        self._open = 0  # received and not answered
        self._next: int | None = None  # one past the offset received last: where reading goes on
        self.committed = committed  # last offset handed to Kafka as committed (next record to read)
        self.closed = False
        self.repeats = 0  # records received at or below an offset already received

    def received(self, offset: int) -> bool:
        """Hold back the commit at `offset` until it is answered. True when the offset is not above one
        received before: the broker handed out two records under one offset (tansu 0.6 after a restart
        raced a topic's creation, issue 45), or the client reset the position backwards. Both records
        are answered and the commit waits for the lowest unanswered offset: dropping the earlier ones,
        as if they would be read again, skipped them for good (they were not read again) and the
        commits moved past them."""
        if self.closed:
            raise RuntimeError("received() on a closed watermark")
        again = self._next is not None and offset < self._next
        heapq.heappush(self._pending, offset)
        self._open += 1
        self._next = offset + 1
        self.repeats += again
        return again

    def answered(self, offset: int) -> bool:
        """Record one answered offset; False (and no effect) once the watermark is closed."""
        if self.closed:
            return False
        self._done[offset] += 1
        self._open -= 1
        while self._pending and self._done[self._pending[0]] > 0:
            self._done[heapq.heappop(self._pending)] -= 1
        return True

    @property
    def unanswered(self) -> int:
        return self._open

    def commit_offset(self) -> int | None:
        """The offset to commit (Kafka's convention: the next record to read), None before any record:
        the lowest unanswered offset, and never past where reading goes on (after an offset handed out
        again, the records between it and the highest one seen are still to come)."""
        if self._pending and self._next is not None:
            return min(self._pending[0], self._next)
        return self._next

    def close(self) -> None:
        self.closed = True
        self._pending.clear()
        self._done.clear()
        self._open = 0


class OffsetTracker(Generic[P]):
    """The watermarks of the currently assigned partitions, and what to commit next."""

    def __init__(self) -> None:
        self._marks: dict[P, Watermark] = {}

    def assign(self, partitions: Iterable[P]) -> None:
        for tp in partitions:
            if tp not in self._marks:
                self._marks[tp] = Watermark()

    def revoke(self, partitions: Iterable[P]) -> None:
        for tp in partitions:
            mark = self._marks.pop(tp, None)
            if mark is not None:
                mark.close()

    def revoke_all(self) -> None:
        self.revoke(list(self._marks))

    def watermark(self, tp: P) -> Watermark:
        """The current assignment's watermark; created on first use (records can beat the assign callback)."""
        mark = self._marks.get(tp)
        if mark is None:
            mark = self._marks[tp] = Watermark()
        return mark

    def partitions(self) -> list[P]:
        return list(self._marks)

    def unanswered(self, partitions: Iterable[P] | None = None) -> int:
        tps = self._marks if partitions is None else partitions
        return sum(self._marks[tp].unanswered for tp in tps if tp in self._marks)

    def to_commit(self, partitions: Iterable[P] | None = None) -> dict[P, int]:
        """Offsets that moved since they were last committed (empty when there is nothing new)."""
        tps = self._marks if partitions is None else partitions
        out: dict[P, int] = {}
        for tp in tps:
            mark = self._marks.get(tp)
            if mark is None:
                continue
            offset = mark.commit_offset()
            if offset is not None and offset != mark.committed:
                out[tp] = offset
        return out

    def committed_offsets(self) -> dict[P, int | None]:
        """The last offset committed for each current partition (None before its first commit)."""
        return {tp: mark.committed for tp, mark in self._marks.items()}

    def committed(self, offsets: dict[P, int]) -> None:
        """Kafka acknowledged these commits; a partition revoked in the meantime is simply skipped."""
        for tp, offset in offsets.items():
            mark = self._marks.get(tp)
            if mark is not None and (mark.committed is None or offset > mark.committed):
                mark.committed = offset
