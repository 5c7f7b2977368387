"""Issue 39: a broker restarted with an empty log while the worker still holds records it fetched from
the broker's previous life. Those records were taken as proof that the new log's end was wrong, and
the worker read on past every record the new log held (256 of 1,898 acknowledged jobs skipped in one
run of four: `the broker reports the log end 63 but delivered records up to offset 69; that log end is
wrong, not a reset: the partition reads on from 70`).

The race is made certain here instead of waited for: the worker's consumer is handed part of a
backlog of `BACKLOG` records, the broker restarts empty, producers send `NEW` (fewer) records to the
fresh log (fewer than the backlog, or more than the old position), and the consumer hands out the rest
of the old backlog (still buffered from the old broker's fetch response) before its group notices
anything. Every record of the fresh log must then be delivered, with the reset named at most once in
the log. The scenario runs `RUNS` times per test run (20 of 20 while developing).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from kafka_scorer.embedded.broker import EmbeddedBroker
from kafka_scorer.kafka.admin import create_topics
from kafka_scorer.kafka.consumer import JobConsumer
from tests.integration.kafka_helpers import Out, produce, unique
from tests.worker.conftest import settings

pytestmark = pytest.mark.integration

BACKLOG, HANDED_BEFORE, RUNS = 100, 30, 3


class _Listener:
    async def on_revoked(self, revoked: set[TopicPartition]) -> None:
        pass

    async def on_assigned(self, assigned: set[TopicPartition]) -> None:
        pass


async def _fill(bootstrap: str, topic: str, life: str, count: int) -> None:
    await produce(bootstrap, [Out(topic, f"{life}-{n}".encode(), partition=0) for n in range(count)])


async def _deliver_until(
    consumer: JobConsumer, want: set[bytes], timeout_s: float, max_records: int = 500
) -> set[bytes]:
    """The worker's poll loop until every wanted value came: fetch, answer at once (commit what was
    handed out, as the worker's committer does once the answers are acknowledged), judge the log ends."""
    seen: set[bytes] = set()
    deadline = time.monotonic() + timeout_s
    while not want <= seen and time.monotonic() < deadline:
        fetched = await consumer.fetch(100, max_records)
        for records in fetched.values():
            seen.update(r.value for r in records)
        answered = {tp: records[-1].offset + 1 for tp, records in fetched.items() if records}
        with contextlib.suppress(KafkaError):
            await consumer.commit(answered)
        await consumer.reposition_reset_logs()
    return seen


async def _one_empty_restart(broker: EmbeddedBroker, new: int, caplog: pytest.LogCaptureFixture) -> None:
    topic = unique("reset")
    await create_topics(broker.bootstrap_servers, [topic], partitions=1)
    await _fill(broker.bootstrap_servers, topic, "old", BACKLOG)
    # A long heartbeat: the group notices the restart only after the old backlog has been handed out,
    # which is the order the race takes in the run the issue reports.
    consumer = JobConsumer(
        settings(
            bootstrap_servers=broker.bootstrap_servers,
            request_topics=[topic],
            group_id=unique("group"),
            auto_offset_reset="earliest",
            fetch_max_wait_ms=20,
            session_timeout_ms=6_000,
            heartbeat_interval_ms=3_000,
        )
    )
    await consumer.start(_Listener())
    try:
        first = await _deliver_until(consumer, {b"old-0"}, 30, max_records=HANDED_BEFORE)
        assert len(first) == HANDED_BEFORE  # the rest of the backlog waits in the consumer's buffer
        caplog.clear()
        broker.stop(timeout_s=0.2)
        await asyncio.sleep(0.3)
        broker.start()  # same port, empty memory
        await create_topics(broker.bootstrap_servers, [topic], partitions=1)
        await _fill(broker.bootstrap_servers, topic, "new", new)
        want = {f"new-{n}".encode() for n in range(new)}
        started = time.monotonic()
        seen = await _deliver_until(consumer, want, 30)
        print(f"fresh log read in {time.monotonic() - started:.1f}s")
    finally:
        await consumer.stop()
    lost = sorted(want - seen, key=lambda v: int(v.split(b"-")[1]))
    assert not lost, f"{len(lost)} of {new} records of the fresh log never delivered: {lost[:5]}..."
    said = [r.getMessage() for r in caplog.records if "positioning it from" in r.getMessage()]
    assert len(said) <= 1, said  # a reset named once (none where the group's rejoin got there first)
    assert not [r for r in caplog.records if "that log end is wrong" in r.getMessage()]


@pytest.mark.parametrize(
    "new",
    [
        pytest.param(60, id="fewer-than-the-backlog"),  # the shape: the old position is past the end
        pytest.param(140, id="past-the-old-position"),  # the fresh log looks like the old one, grown
    ],
)
async def test_records_from_the_brokers_previous_life_never_make_the_fresh_log_skipped(new, caplog) -> None:
    with EmbeddedBroker() as broker:
        for _ in range(RUNS):
            await _one_empty_restart(broker, new, caplog)
