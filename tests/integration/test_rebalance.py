"""Two workers in one group, one leaves mid-stream: no job lost, none answered by both."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from kafka_scorer.protocol import decode_result
from tests.integration.jobs import Reference, assert_matches_reference, expected_id, mixed_jobs, to_record
from tests.integration.kafka_helpers import (
    InProcessWorker,
    create_topics,
    produce,
    read_topic,
    unique,
    wait_for_commits,
    worker_settings,
)

pytestmark = pytest.mark.integration

PARTITIONS = 4
WAVES, PER_WAVE = 8, 40


async def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def test_one_of_two_workers_leaves_without_losing_or_doubling_a_job(
    kafka, causal_model, causal_scorer
) -> None:
    from kafka_scorer.engine.scorer import Scorer

    requests, replies, group = unique("req"), unique("res"), unique("group")
    await create_topics(kafka.bootstrap, [requests, replies], partitions=PARTITIONS)
    sent = mixed_jobs(WAVES * PER_WAVE, seed=11, model_name=causal_scorer.model_name, prefix="rb")
    records = [
        to_record(s, requests, partition=i % PARTITIONS, with_content_type=True) for i, s in enumerate(sent)
    ]

    def settings(name: str):
        return worker_settings(
            kafka,
            causal_model,
            request_topics=[requests],
            reply_topic=replies,
            group_id=group,
            client_id=name,
            max_batch_tokens=256,  # several batches per wave, so work is in flight when B leaves
        )

    second_scorer = Scorer(str(causal_model), dtype="float32", device="cpu")  # one device thread per worker
    async with InProcessWorker(settings("worker-a"), causal_scorer) as a:
        b = InProcessWorker(settings("worker-b"), second_scorer)
        await b.__aenter__()
        both = lambda: a.worker.consumer.assignment() and b.worker.consumer.assignment()  # noqa: E731
        await _wait(both, 30, "both workers to hold partitions")

        for wave in range(WAVES):
            await produce(kafka.bootstrap, records[wave * PER_WAVE : (wave + 1) * PER_WAVE])
            if wave == WAVES // 2:
                assert await b.stop() == 0  # B leaves with the stream running
                await _wait(
                    lambda: len(a.worker.consumer.assignment()) == PARTITIONS, 30, "A to own all partitions"
                )
            await asyncio.sleep(0.05)

        got = await read_topic(
            kafka.bootstrap, replies, lambda rs: len(rs) >= len(sent), timeout_s=90, settle_s=1.0
        )
        committed, ends = await wait_for_commits(kafka.bootstrap, group, requests, PARTITIONS, len(sent))
        answered_a, answered_b = a.worker.metrics.jobs._value.get(), b.worker.metrics.jobs._value.get()
        assert await a.stop() == 0

    counts = Counter()
    reference = Reference(causal_model)
    by_id = {expected_id(s): s for s in sent}
    for record in got:
        result = decode_result(record.value, dict(record.headers)["content-type"].decode())
        counts[result.id] += 1
        assert_matches_reference(result, by_id[result.id], reference)
    print(f"rebalance: A answered {answered_a:.0f}, B answered {answered_b:.0f}")
    assert set(counts) == set(by_id), f"lost: {sorted(set(by_id) - set(counts))[:10]}"
    assert max(counts.values()) == 1, f"answered twice: {[k for k, v in counts.items() if v > 1]}"
    assert answered_a > 0 and answered_b > 0
    assert answered_a + answered_b == len(sent)
    assert committed == ends
