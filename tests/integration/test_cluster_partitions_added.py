"""The request topic grows while two workers serve it (issue 45): the new partitions' jobs are answered
within `NEW_PARTITIONS_S`.

A consumer learns of new partitions only from a metadata refresh: aiokafka refreshes every
`metadata_max_age_ms` (its default, like the Java client's, 5 minutes), and only then does the group's
leader see the partition count change and rejoin, so for up to five minutes the jobs on the new
partitions sat unread. The worker's default is 30 s (`metadata_max_age_ms`, kafka/connection.py).

Asserted: the jobs produced (acks=all) to the new partitions right after they were added are answered
as the reference scores them, every partition ends owned by one worker, no worker exits; the time from
the partitions' creation to the last new job answered is printed (the bound is the metadata age plus a
rebalance).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.integration.cluster import RUNS, all_up, cluster_topics
from tests.integration.jobs import assert_answers, expected_id, mixed_jobs, to_record
from tests.integration.kafka_helpers import InProcessWorker, decode_replies, produce, read_topic

pytestmark = [pytest.mark.integration, pytest.mark.apache_kafka, pytest.mark.kafka_cluster]

BEFORE, AFTER, JOBS = 2, 4, 24
NEW_PARTITIONS_S = 60.0  # 30 s metadata age + a rebalance (up to rebalance_grace_s) + the answers


async def _answered(bootstrap: str, topic: str, want: set[str], timeout_s: float) -> list:
    done = lambda rs: want <= {r.id for r in decode_replies(rs)}  # noqa: E731
    records = await read_topic(bootstrap, topic, done, timeout_s)
    return decode_replies(records)


async def _grow(cluster, run: int, model, scorer, reference) -> float:
    topics = await cluster_topics(cluster, BEFORE)
    bootstrap = topics.broker.bootstrap
    name = scorer.describe().model_name
    old = mixed_jobs(JOBS, seed=4900 + run, model_name=name, prefix=f"pa-old{run}")
    new = mixed_jobs(JOBS, seed=5000 + run, model_name=name, prefix=f"pa-new{run}")
    settings = topics.settings(model, max_batch_tokens=64, rebalance_grace_s=3.0)
    async with (
        InProcessWorker(settings, scorer.engine) as one,
        InProcessWorker(settings, scorer.engine) as two,
    ):
        await produce(bootstrap, [to_record(s, topics.requests, i % BEFORE, True) for i, s in enumerate(old)])
        await _answered(bootstrap, topics.replies, {expected_id(s) for s in old}, 60)
        await asyncio.to_thread(cluster.add_partitions, topics.requests, AFTER)
        grown = time.monotonic()
        added = AFTER - BEFORE
        await produce(
            bootstrap, [to_record(s, topics.requests, BEFORE + i % added, True) for i, s in enumerate(new)]
        )
        want = {expected_id(s) for s in new}
        answers = await _answered(bootstrap, topics.replies, want, NEW_PARTITIONS_S + 60)
        took = time.monotonic() - grown
        owned = sorted(tp.partition for w in (one, two) for tp in w.worker.consumer.assignment())
        assert one.running and two.running, "a worker exited"
        assert await one.stop() == 0 and await two.stop() == 0
    assert want <= {r.id for r in answers}, f"new partitions' jobs unanswered after {took:.0f}s"
    assert_answers([r for r in answers if r.id in want], new, reference, once=False)
    assert owned == list(range(AFTER)), f"partitions owned after the growth: {owned}"
    return took


@pytest.mark.timeout(200 * RUNS)
async def test_partitions_added_live(kafka_cluster, causal_model, causal_scorer, causal_reference) -> None:
    await all_up(kafka_cluster)
    took = [
        await _grow(kafka_cluster, run, causal_model, causal_scorer, causal_reference) for run in range(RUNS)
    ]
    seconds = sorted(round(t, 1) for t in took)
    print(f"new partitions' jobs answered {seconds} s after the growth ({RUNS} runs)")
    assert max(took) <= NEW_PARTITIONS_S
