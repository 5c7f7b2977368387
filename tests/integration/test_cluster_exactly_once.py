"""Exactly-once on the three-node cluster while the transaction coordinator's node is SIGKILLed (issue 45,
"a transaction from a lost generation").

Seen before the fix: the node that coordinated both the worker's group and its transactions was killed;
the worker lost its group membership, rejoined with the same partitions and read them again from the
committed offset 63, while the old membership's transaction (offsets 63-64) was still pending; it
committed afterwards, and the re-read answered the same two records again in another transaction:
three jobs twice under `read_committed`, in kafka-python and in librdkafka. aiokafka's
`send_offsets_to_transaction` carries no generation, so the broker cannot fence that transaction; the
worker must abort it itself before it can commit (worker/transaction_fence.py).

The group id is picked so that one node coordinates both the group and the transactions (the case seen),
and that node is killed under load, then started again. Asserted: every job answered exactly once, as
two independent clients read the reply topic `read_committed`; the group's committed offsets never move
back; the worker never exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import Counter

import pytest

from tests.integration.cluster import RUNS, all_up, cluster_topics
from tests.integration.independent_readers import read_committed_confluent, read_committed_kafka_python
from tests.integration.jobs import assert_answers, expected_id, mixed_jobs, to_record
from tests.integration.kafka_helpers import InProcessWorker, committed_offsets, produce, unique

pytestmark = [pytest.mark.integration, pytest.mark.apache_kafka, pytest.mark.kafka_cluster]

PARTITIONS, BEFORE, DURING = 3, 120, 120
STALE_S = 5.0  # a coordinator failover's stale offset fetches end well within this (about 1 s here)


async def _same_coordinator(cluster, topics):
    """`topics` with a group id whose coordinator is the node that coordinates `txn_id`'s transactions."""
    txn_id = unique("txn")
    node = await asyncio.to_thread(cluster.transaction_coordinator, txn_id)
    for _ in range(40):
        group = unique("group")
        if await asyncio.to_thread(cluster.group_coordinator, group) == node:
            return dataclasses.replace(topics, group=group), txn_id, node
    raise AssertionError(f"no group id coordinated by node {node} in 40 tries")


async def _watch_commits(bootstrap: str, topics, moved_back: list[str], stop: asyncio.Event) -> None:
    """Record a committed offset that stays below one seen before for longer than `STALE_S` (a commit of
    an older membership landing late, or a re-read committing again from below).

    Right after the group's coordinator moved, the new one answers offset fetches from its partition's
    high-water mark, which lags for a moment (BROKERS.md): a reader sees an older offset briefly, and
    sees it move forward again by itself. Such episodes are not a commit moving back."""
    highest: dict[int, int] = {}
    below_since: dict[int, float] = {}
    while not stop.is_set():
        with contextlib.suppress(Exception):  # a node down: asked again on the next round
            now = await committed_offsets(bootstrap, topics.group, topics.requests, PARTITIONS)
            for partition, offset in now.items():
                if offset is None:
                    continue
                if offset >= highest.get(partition, -1):
                    highest[partition] = offset
                    below_since.pop(partition, None)
                    continue
                since = below_since.setdefault(partition, time.monotonic())
                if time.monotonic() - since > STALE_S:
                    moved_back.append(f"[{partition}] {highest[partition]} -> {offset} for {STALE_S:.0f}s")
        await asyncio.sleep(0.25)


async def _kill_the_transaction_coordinator(cluster, run: int, model, scorer, reference) -> None:
    topics, txn_id, node = await _same_coordinator(cluster, await cluster_topics(cluster, PARTITIONS))
    bootstrap = topics.broker.bootstrap
    name = scorer.describe().model_name
    before = mixed_jobs(BEFORE, seed=4500 + run, model_name=name, prefix=f"eo-before{run}")
    during = mixed_jobs(DURING, seed=4600 + run, model_name=name, prefix=f"eo-during{run}")
    settings = topics.settings(
        model, delivery="exactly_once", transactional_id=txn_id, max_batch_tokens=64, rebalance_grace_s=3.0
    )
    moved_back: list[str] = []
    stop_watch = asyncio.Event()
    async with InProcessWorker(settings, scorer.engine) as worker:
        watch = asyncio.create_task(_watch_commits(bootstrap, topics, moved_back, stop_watch))
        await produce(
            bootstrap, [to_record(s, topics.requests, i % PARTITIONS, True) for i, s in enumerate(before)]
        )
        await topics.read_answers(BEFORE // 4, timeout_s=60, committed_only=True)
        await asyncio.to_thread(cluster.kill, node)  # transactions in flight, coordinator gone
        await produce(
            bootstrap, [to_record(s, topics.requests, i % PARTITIONS, True) for i, s in enumerate(during)]
        )
        await asyncio.to_thread(cluster.restart, node)
        sent = [*before, *during]
        answers = await asyncio.to_thread(
            read_committed_kafka_python, bootstrap, topics.replies, len(sent), 120.0, 3.0
        )
        librdkafka = await asyncio.to_thread(
            read_committed_confluent, bootstrap, topics.replies, len(sent), 30.0, 1.0
        )
        final = await committed_offsets(bootstrap, topics.group, topics.requests, PARTITIONS)
        stop_watch.set()
        await watch
        assert worker.running, "the worker exited"
        assert await worker.stop() == 0
    for reader, results in (("kafka-python", answers), ("confluent-kafka", librdkafka)):
        counts = Counter(r.id for r in results)
        want = {expected_id(s) for s in sent}
        lost = want - set(counts)
        twice = sorted(job for job, n in counts.items() if n > 1)
        seen = f"kafka-python {len(answers)}, confluent-kafka {len(librdkafka)} results, committed {final}"
        assert not lost, (
            f"{reader}: {len(lost)} of {len(want)} jobs never answered: {sorted(lost)[:8]} ({seen})"
        )
        assert not twice, f"{reader}: {len(twice)} jobs answered twice under read_committed: {twice[:8]}"
    assert not moved_back, f"committed offsets moved back: {moved_back}"
    per_partition = (BEFORE + DURING) // PARTITIONS
    assert final == dict.fromkeys(range(PARTITIONS), per_partition), f"committed at the end: {final}"
    assert_answers(answers, sent, reference, once=True)


@pytest.mark.timeout(240 * RUNS)
async def test_the_transaction_coordinators_node_killed_under_exactly_once(
    kafka_cluster, causal_model, causal_scorer, causal_reference, caplog
) -> None:
    await all_up(kafka_cluster)
    for run in range(RUNS):
        await _kill_the_transaction_coordinator(
            kafka_cluster, run, causal_model, causal_scorer, causal_reference
        )
    assert "still below" not in caplog.text, "a re-read started below this worker's own committed offset"
