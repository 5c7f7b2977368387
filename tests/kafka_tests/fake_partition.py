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
