"""Workers started together on the three-node cluster settle their group (issue 45, "a group that never
settles").

Two workers started at once on the cluster never settled: the nodes logged `Preparing to rebalance
group` 1,400 times in 150 s, the reason `Updating metadata for member … during CompletingRebalance`.
aiokafka 0.14 sends one JoinGroup per offered assignor, each with one more protocol than the last
(aio-libs/aiokafka#1168), and the worker offered two (its one-model check, then plain round-robin): every
join was followed by a second with other metadata, which restarts the rebalance the first completed,
for every member, for ever. The worker offers one protocol now (kafka/group_model.py).

Settled: every worker ready, the partitions shared out once each among all of them under one generation,
and that holding for `STABLE_S`; then jobs are answered, so the group also consumes.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from kafka_scorer.kafka.fenced_commit import membership_of
from tests.integration.cluster import RUNS, all_up, cluster_topics
from tests.integration.jobs import expected_id, mixed_jobs, to_record
from tests.integration.kafka_helpers import InProcessWorker, produce

pytestmark = [pytest.mark.integration, pytest.mark.apache_kafka, pytest.mark.kafka_cluster]

PARTITIONS = 8
SETTLE_S = 30.0  # the bound a group of up to eight workers started at once must settle within
STABLE_S = 3.0  # how long the settled state must hold: a livelocked group settles for a moment too


def _settled(workers: list[InProcessWorker]) -> bool:
    """One generation, every worker ready, each partition owned by exactly one of them."""
    memberships = [membership_of(w.worker.consumer._consumer) for w in workers]
    if any(m is None for m in memberships) or len({m.generation for m in memberships if m}) != 1:
        return False
    if not all(w.worker.ready for w in workers):
        return False
    owned = [tp.partition for w in workers for tp in w.worker.consumer.assignment()]
    return sorted(owned) == list(range(PARTITIONS))


async def _settle_time(workers: list[InProcessWorker], timeout_s: float) -> float:
    """Seconds from now until the group has stayed settled for `STABLE_S` (minus that hold)."""
    began = time.monotonic()
    since: float | None = None
    while time.monotonic() - began < timeout_s:
        for w in workers:
            assert w.running, "a worker exited while its group formed"
        if _settled(workers):
            since = since if since is not None else time.monotonic()
            if time.monotonic() - since >= STABLE_S:
                return since - began
        else:
            since = None
        await asyncio.sleep(0.05)
    raise AssertionError(f"{len(workers)} workers started together did not settle in {timeout_s:.0f}s")


async def _start_together(kafka_cluster, count: int, run: int, causal_model, causal_scorer) -> float:
    topics = await cluster_topics(kafka_cluster, PARTITIONS)
    settings = topics.settings(causal_model, max_batch_tokens=64)
    workers = [InProcessWorker(settings, causal_scorer.engine) for _ in range(count)]
    tasks = [asyncio.create_task(w.worker.run(w._stop)) for w in workers]
    for w, task in zip(workers, tasks, strict=True):
        w._task = task
    try:
        settle_s = await _settle_time(workers, SETTLE_S + STABLE_S + 10)
        jobs = mixed_jobs(
            2 * PARTITIONS, seed=450 + run, model_name=causal_scorer.describe().model_name, prefix=f"g{run}"
        )
        await produce(
            topics.broker.bootstrap,
            [to_record(s, topics.requests, i % PARTITIONS, True) for i, s in enumerate(jobs)],
        )
        answers = await topics.read_answers(len(jobs), timeout_s=60)
        assert {expected_id(s) for s in jobs} <= {r.id for r in answers}
    finally:
        codes = await asyncio.gather(*(w.stop() for w in workers if w.running))
    assert all(code == 0 for code in codes)
    return settle_s


@pytest.mark.timeout(120 * RUNS)
@pytest.mark.parametrize("count", [2, 4, 8])
async def test_workers_started_together_settle(kafka_cluster, count, causal_model, causal_scorer) -> None:
    await all_up(kafka_cluster)
    times = [
        await _start_together(kafka_cluster, count, run, causal_model, causal_scorer) for run in range(RUNS)
    ]
    print(f"{count} workers started together settled in {sorted(round(t, 1) for t in times)} s ({RUNS} runs)")
    assert max(times) <= SETTLE_S
