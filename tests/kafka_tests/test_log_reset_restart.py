"""Issue 39's run, replayed with aiokafka's consumer faked: a broker restarted with an empty log while
the worker still held records fetched from its previous life.

The worker logged `the broker reports the log end 63 but delivered records up to offset 69; that log
end is wrong, not a reset: the partition reads on from 70` and skipped every record the new log held
below 70 (256 of 1,898 acknowledged jobs in one run of four). What happened, step by step, as the fake
below plays it:
1. the old broker's fetch response carried a backlog; the worker was handed part of it, the rest stayed
   in the consumer's buffer (aiokafka fetches no partition that still has records waiting);
2. the broker came back empty on the same address (a new connection) and producers refilled the log;
3. the worker was handed the rest of the old backlog, and while it accepted those records the consumer
   fetched from its new position in the new log: a response with that log's (too small, the embedded
   broker's) end and a new stamp;
4. the reset check took the old records as proof that the new end was wrong, and read on.

The fake's log does exactly that; the worker's poll loop (`JobConsumer.fetch`, then
`reposition_reset_logs`) must deliver every record of the new log. The real brokers run the restart in
tests/integration/test_empty_restart.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from aiokafka import TopicPartition

from kafka_scorer.kafka.consumer import JobConsumer
from tests.kafka_tests.fake_partition import FakePartition
from tests.worker.conftest import TP, settings

BACKLOG, HANDED_BEFORE, REPORTED_END = 100, 30, 63


class _RestartingLog(FakePartition):
    """One partition on a broker that restarts empty: a new log of `fresh` records (0..fresh-1) whose
    fetch responses report `REPORTED_END` as its end, and an old backlog still buffered."""

    def __init__(self, fresh: int) -> None:
        super().__init__(position=0)
        self.fresh = fresh
        self.buffered: list[int] = []  # offsets of the old log, not handed out yet
        self.delivered: list[tuple[str, int]] = []
        self.life = "old"
        self.stamp = 0

    def respond(self, highwater: int) -> None:
        self.stamp += 1
        self.state.highwater, self.state.timestamp = highwater, self.stamp

    def fetch_old_backlog(self) -> None:
        self.respond(BACKLOG)
        self.buffered = list(range(self.state.position, BACKLOG))

    def restart_empty(self) -> None:
        """Same address, new process: a new connection, a new log, nothing of the old one."""
        self.life = "new"
        self.reconnect()

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list]:
        if self.buffered:  # what the previous response left in the buffer
            offsets, self.buffered = self.buffered[:max_records], self.buffered[max_records:]
            self.state.position = offsets[-1] + 1
            self.delivered.extend(("old", o) for o in offsets)
            if self.life == "new" and not self.buffered:
                self.respond(REPORTED_END)  # fetched from the new log while the worker accepts these
            return {TP: [SimpleNamespace(offset=o) for o in offsets]}
        if self.life == "old":
            return {}
        start = self.state.position
        offsets = list(range(start, min(self.fresh, start + max_records)))
        self.respond(REPORTED_END)
        self.state.position = start + len(offsets)
        self.delivered.extend(("new", o) for o in offsets)
        return {TP: [SimpleNamespace(offset=o) for o in offsets]} if offsets else {}


async def _poll(consumer: JobConsumer, max_records: int = 500) -> None:
    await consumer.fetch(100, max_records)
    await consumer.reposition_reset_logs()


@pytest.mark.parametrize(
    "fresh",
    [
        pytest.param(140, id="refilled-past-the-old-position"),  # the run: 70 < the new log's end
        pytest.param(60, id="fewer-than-the-backlog"),
    ],
)
async def test_records_of_the_old_log_never_make_the_new_log_skipped(fresh, caplog) -> None:
    log = _RestartingLog(fresh)
    consumer = JobConsumer(settings(auto_offset_reset="earliest"))
    consumer._consumer = log  # type: ignore[assignment]
    log.fetch_old_backlog()
    await _poll(consumer, max_records=HANDED_BEFORE)
    log.restart_empty()
    for _ in range(10):
        await _poll(consumer)
    got = sorted(o for life, o in log.delivered if life == "new")
    assert set(got) == set(range(fresh)), (
        f"new-log records never delivered: {sorted(set(range(fresh)) - set(got))}"
    )
    assert not [r for r in caplog.records if "that log end is wrong" in r.getMessage()]
    resets = [r.getMessage() for r in caplog.records if "positioning it from" in r.getMessage()]
    assert len(resets) == 1, resets  # the reset named once
