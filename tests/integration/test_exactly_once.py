"""Exactly-once mode across a crash: a `read_committed` reader sees each result once.

Runs on a broker with transactions: the session broker when it has them (testcontainers, or
KAFKA_BOOTSTRAP_SERVERS), else noida-db; the `transactional_kafka` fixture skips with the reason when
none is available (the embedded tansu refuses aiokafka's transactional producer).
"""

from __future__ import annotations

import signal

import pytest

from tests.integration.jobs import assert_answers, mixed_stream
from tests.integration.kafka_helpers import WorkerProcess, produce, read_topic

pytestmark = pytest.mark.integration


async def test_read_committed_reader_sees_each_result_once_across_a_crash(
    transactional_kafka, causal_model, causal_scorer, causal_reference
) -> None:
    kafka = transactional_kafka
    stream = await mixed_stream(kafka, 200, seed=41, model_name=causal_scorer.model_name, prefix="eos")
    settings = stream.settings(
        causal_model,
        delivery="exactly_once",
        client_id="eos-worker",  # same transactional id after the restart: it fences the killed one
        group_instance_id="eos-worker-0",  # static membership: the restart takes the partitions back at once
        max_batch_tokens=64,
    )

    async with WorkerProcess(settings, "eos-killed") as first:
        assert "producer started (transactional" in first.output()
        await produce(kafka.bootstrap, stream.records)
        await stream.wait_for_answers(30, first, timeout_s=60, committed_only=True)
        first.signal(signal.SIGKILL)
        await first.wait()

    async with WorkerProcess(settings, "eos-restarted") as second:
        assert "producer started (transactional" in second.output(), second.output()[-3000:]
        got = await stream.read_answers(len(stream.sent), timeout_s=120, settle_s=1.0, committed_only=True)
        committed, ends = await stream.wait_for_commits(len(stream.sent))
        second.signal(signal.SIGTERM)
        assert await second.wait() == 0, second.output()[-4000:]

    everything = await read_topic(kafka.bootstrap, stream.replies, lambda rs: False, timeout_s=2.0)
    print(f"exactly-once on {kafka.name}: {len(got)} committed results, {len(everything)} records in the log")
    logs = f"killed worker:\n{first.output()[-3000:]}\nrestarted worker:\n{second.output()[-3000:]}"
    assert_answers(got, stream.sent, causal_reference, context=f"\n{logs}")
    assert committed == ends
