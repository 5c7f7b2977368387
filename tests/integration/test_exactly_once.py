"""Exactly-once mode across a crash: a `read_committed` reader sees each result once.

Runs on a broker with transactions: the session broker when it has them (testcontainers, or
KAFKA_BOOTSTRAP_SERVERS), else noida-db; the `transactional_kafka` fixture skips with the reason when
none is available (the embedded tansu refuses aiokafka's transactional producer).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter

import pytest

from kafka_scorer.protocol import decode_result
from tests.integration.jobs import Reference, assert_matches_reference, expected_id, mixed_jobs, to_record
from tests.integration.kafka_helpers import (
    WorkerProcess,
    create_topics,
    produce,
    read_topic,
    unique,
    wait_for_commits,
    worker_settings,
)

pytestmark = pytest.mark.integration


def _ids(records) -> list[str]:
    return [decode_result(r.value, dict(r.headers)["content-type"].decode()).id for r in records]


async def _committed_results(
    bootstrap: str, topic: str, distinct: int, timeout_s: float, settle_s: float = 0.0
):
    return await read_topic(
        bootstrap,
        topic,
        lambda rs: len(set(_ids(rs))) >= distinct,
        timeout_s,
        isolation_level="read_committed",
        settle_s=settle_s,
    )


async def test_read_committed_reader_sees_each_result_once_across_a_crash(
    transactional_kafka, causal_model, causal_scorer
) -> None:
    kafka = transactional_kafka
    requests, replies, group = unique("req"), unique("res"), unique("group")
    await create_topics(kafka.bootstrap, [requests, replies], partitions=3)
    sent = mixed_jobs(200, seed=41, model_name=causal_scorer.model_name, prefix="eos")
    records = [to_record(s, requests, partition=i % 3, with_content_type=True) for i, s in enumerate(sent)]
    settings = worker_settings(
        kafka,
        causal_model,
        request_topics=[requests],
        reply_topic=replies,
        group_id=group,
        delivery="exactly_once",
        client_id="eos-worker",  # same transactional id after the restart: it fences the killed one
        group_instance_id="eos-worker-0",  # static membership: the restart takes the partitions back at once
        max_batch_tokens=64,
    )

    first = WorkerProcess(settings, "eos-killed")
    try:
        await first.wait_for_log("worker ready")
        assert "producer started (transactional" in first.output()
        await produce(kafka.bootstrap, records)
        deadline = time.monotonic() + 60
        while len(set(_ids(await _committed_results(kafka.bootstrap, replies, 30, timeout_s=1.0)))) < 30:
            assert time.monotonic() < deadline, first.output()[-4000:]
            await asyncio.sleep(0.1)
        first.signal(signal.SIGKILL)
        await first.wait()
    finally:
        first_log = first.output()
        first.close()

    second = WorkerProcess(settings, "eos-restarted")
    try:
        await second.wait_for_log("worker ready")
        assert "producer started (transactional" in second.output(), second.output()[-3000:]
        got = await _committed_results(kafka.bootstrap, replies, len(sent), timeout_s=120, settle_s=1.0)
        committed, ends = await wait_for_commits(kafka.bootstrap, group, requests, 3, len(sent))
        second.signal(signal.SIGTERM)
        assert await second.wait() == 0, second.output()[-4000:]
    finally:
        second_log = second.output()
        second.close()

    everything = await read_topic(kafka.bootstrap, replies, lambda rs: False, timeout_s=2.0)
    counts = Counter(_ids(got))
    print(f"exactly-once on {kafka.name}: {len(got)} committed results, {len(everything)} records in the log")
    by_id = {expected_id(s): s for s in sent}
    logs = f"killed worker:\n{first_log[-3000:]}\nrestarted worker:\n{second_log[-3000:]}"
    assert set(counts) == set(by_id), f"missing {sorted(set(by_id) - set(counts))[:10]}\n{logs}"
    assert max(counts.values()) == 1, f"seen twice: {[k for k, v in counts.items() if v > 1][:10]}\n{logs}"
    reference = Reference(causal_model)
    for record in got:
        result = decode_result(record.value, dict(record.headers)["content-type"].decode())
        assert_matches_reference(result, by_id[result.id], reference)
    assert committed == ends
