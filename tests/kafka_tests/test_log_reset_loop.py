"""Issue 26: after an embedded-broker restart the worker re-scored the same records forever. The fresh
log held offsets 0-10 but every fetch response said its end was 2; the reset check believed it on every
poll, positioned the partition at 0 again, read 0-10 again, and so on, every ~200 ms.

Here aiokafka's consumer is faked by a log that does exactly that, and the worker's poll loop
(`JobConsumer.fetch`, then `reposition_reset_logs`) runs against it: the reset is acted on once, the
records are delivered at most twice (once before, once after that one reset), and the contradiction
is reported instead of acted on. The real broker's restart runs in tests/integration/test_log_reset.py.
"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

from aiokafka import TopicPartition

from kafka_scorer.kafka.consumer import JobConsumer
from kafka_scorer.kafka.log_reset import Verdicts
from tests.kafka_tests.fake_partition import FakePartition
from tests.worker.conftest import TP, settings

POLLS = 60


class _LyingLog(FakePartition):
    """One partition holding `records` offsets whose fetch responses report `reported_end` as the end."""

    def __init__(self, records: int, reported_end: int, position: int) -> None:
        super().__init__(position)
        self.records = records
        self.reported_end = reported_end
        self.delivered: Counter[int] = Counter()
        self._responses = 0

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list]:
        start = self.state.position
        offsets = list(range(start, min(self.records, start + max_records)))
        self._responses += 1
        self.state.highwater, self.state.timestamp = self.reported_end, self._responses
        self.state.position = start + len(offsets)
        self.delivered.update(offsets)
        return {TP: [SimpleNamespace(offset=o) for o in offsets]} if offsets else {}


async def _poll_loop(fake: _LyingLog) -> list[Verdicts[TopicPartition]]:
    consumer = JobConsumer(settings(auto_offset_reset="earliest"))
    consumer._consumer = fake  # type: ignore[assignment]
    resets = []
    for _ in range(POLLS):
        await consumer.fetch(100, 500)
        resets.append(await consumer.reposition_reset_logs())
    return resets


async def test_a_log_end_contradicted_by_fetched_records_is_acted_on_once_not_in_a_loop(caplog) -> None:
    """The worker's old position 11 is beyond the reported end 2: one reset. Reading the fresh log
    from 0 then delivers offsets 0-10 in responses that say the log ends at 2: not a reset."""
    fake = _LyingLog(records=11, reported_end=2, position=11)
    resets = await _poll_loop(fake)
    assert sum(len(r.reset) for r in resets) == 1, "the reset is acted on once, not on every poll"
    assert max(fake.delivered.values()) == 1, fake.delivered  # each record of the fresh log read once
    assert sorted(fake.delivered) == list(range(11))
    beyond = [r for r in caplog.records if "beyond the log end" in r.getMessage()]
    assert len(beyond) == 1, [r.getMessage() for r in beyond]
    contradicted = [r for r in caplog.records if "delivered records up to offset 10" in r.getMessage()]
    assert len(contradicted) == 1, [r.getMessage() for r in caplog.records]


async def test_a_fresh_log_read_from_the_start_is_never_reset_by_its_own_wrong_end(caplog) -> None:
    """Positioned at 0 (a fresh assignment), the records themselves prove the log reaches offset 10."""
    fake = _LyingLog(records=11, reported_end=2, position=0)
    resets = await _poll_loop(fake)
    assert not any(r.reset or r.refused for r in resets)
    assert set(fake.delivered.values()) == {1}
