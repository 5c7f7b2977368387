"""Two workers in one group, one leaves mid-stream: no job lost, none answered by both."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.integration.brokers import on_each_broker
from tests.integration.jobs import assert_answers, mixed_stream
from tests.integration.kafka_helpers import InProcessWorker, decode_replies, produce

pytestmark = pytest.mark.integration

PARTITIONS = 4
WAVES, PER_WAVE = 8, 40


async def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@on_each_broker()
async def test_one_of_two_workers_leaves_without_losing_or_doubling_a_job(
    kafka, causal_model, causal_scorer, causal_reference
) -> None:
    from kafka_scorer.engine.scorer import Scorer

    stream = await mixed_stream(
        kafka,
        WAVES * PER_WAVE,
        seed=11,
        model_name=causal_scorer.describe().model_name,
        prefix="rb",
        partitions=PARTITIONS,
    )

    def settings(name: str):
        # Several batches per wave, so work is in flight when B leaves.
        return stream.settings(causal_model, client_id=name, max_batch_tokens=256)

    second_scorer = Scorer(str(causal_model), dtype="float32", device="cpu")  # one device thread per worker
    async with InProcessWorker(settings("worker-a"), causal_scorer.engine) as a:
        b = InProcessWorker(settings("worker-b"), second_scorer.engine)
        await b.__aenter__()
        both = lambda: a.worker.consumer.assignment() and b.worker.consumer.assignment()  # noqa: E731
        await _wait(both, 30, "both workers to hold partitions")

        for wave in range(WAVES):
            await produce(kafka.bootstrap, stream.records[wave * PER_WAVE : (wave + 1) * PER_WAVE])
            if wave == WAVES // 2:
                assert await b.stop() == 0  # B leaves with the stream running
                await _wait(
                    lambda: len(a.worker.consumer.assignment()) == PARTITIONS, 30, "A to own all partitions"
                )
            await asyncio.sleep(0.05)

        got = await stream.read_replies(len(stream.sent), timeout_s=90, settle_s=1.0)
        committed, ends = await stream.wait_for_commits(len(stream.sent))
        answered_a, answered_b = a.worker.metrics.jobs._value.get(), b.worker.metrics.jobs._value.get()
        assert await a.stop() == 0

    print(f"rebalance: A answered {answered_a:.0f}, B answered {answered_b:.0f}")
    assert_answers(decode_replies(got), stream.sent, causal_reference)
    assert answered_a > 0 and answered_b > 0
    assert answered_a + answered_b == len(stream.sent)
    assert committed == ends
