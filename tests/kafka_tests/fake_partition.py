"""One partition as `JobConsumer` sees aiokafka's consumer: the fetch state `kafka/subscription.py` reads,
the leader connection that names the log, and the seeks a reset makes. The log-reset tests subclass it
with a `getmany` that plays their broker (test_log_reset_loop.py, test_log_reset_restart.py)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from aiokafka import TopicPartition

from tests.worker.conftest import TP


@dataclass
class FetchStateFake:
    """aiokafka's per-partition fetch state."""

    position: int
    highwater: int | None = None
    timestamp: int | None = None
    has_valid_position: bool = True


class Connection:
    """The leader connection: a new object is a new broker process (`subscription.py`)."""

    def connected(self) -> bool:
        return True


class FakePartition:
    """Partition `TP` on leader 1, positioned at `position`, on a broker that lost the group's offsets."""

    def __init__(self, position: int) -> None:
        self.state = FetchStateFake(position)
        assignment = SimpleNamespace(tps=[TP], active=True, state_value=lambda tp: self.state)
        self._subscription = SimpleNamespace(subscription=SimpleNamespace(assignment=assignment))
        self._coordinator = SimpleNamespace(generation=1, _coordination_task=None)
        cluster = SimpleNamespace(leader_for_partition=lambda tp: 1)
        self._client = SimpleNamespace(cluster=cluster, _conns={(1, 0): Connection()})

    def reconnect(self) -> None:
        """The broker restarted on the same address: the consumer's connection is a new one."""
        self._client._conns[(1, 0)] = Connection()

    async def committed(self, tp: TopicPartition) -> int | None:
        return None  # the restarted broker lost the group's offsets

    async def seek_to_beginning(self, tp: TopicPartition) -> None:
        self.state.position = 0

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.state.position = offset

    def assignment(self) -> set[TopicPartition]:
        return {TP}

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.state.highwater


OTHER = TopicPartition("requests", 1)
BAD_HEADER = UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")


class DrainsOtherFirst:
    """aiokafka's consumer as a poll that raises midway meets it (kafka/unreadable.py's `PollStart`):
    `TP` holds an unreadable record at its position, `OTHER` six readable ones from offset 3. A poll
    of both drains `OTHER` first (its position moves to 9) and then raises on `TP`, as aiokafka's drain
    does; a poll of one partition reads that partition alone."""

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
        records = [
            SimpleNamespace(topic=OTHER.topic, partition=1, offset=o, timestamp=o, headers=[])
            for o in range(start, 9)
        ]
        return {OTHER: records}

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
