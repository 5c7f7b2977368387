"""Nodes of the three-node cluster killed or restarted under load (issue 45).

Two workers in one group (at-least-once) answer a backlog held in flight when the fault strikes:
- `leader`: the node leading partition 0 is SIGKILLed, jobs keep coming while it is down, and it is
  started again with its log;
- `group-coordinator`: the same for the node coordinating the workers' group;
- `rolling`: every node in turn stopped cleanly and started again (the routine upgrade);
- `empty-disk`: the node leading partition 0 is SIGKILLed and started at once on an empty disk (a
  replaced volume): it rejoins the quorum and re-replicates every partition while jobs keep coming.
Another replica leads meanwhile (replication 3, `min.insync.replicas=2`: producers with acks=all go
on). Asserted, as the delivery contract says: every acknowledged job answered as the reference scores
it; only jobs in flight at the fault (at or past the group's committed offset then) answered twice,
so a lagging high-water mark after a failover re-reads no partition from its start
(kafka/lagging_end.py); no worker exits.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from tests.integration.cluster import RUNS, all_up, cluster_topics
from tests.integration.jobs import assert_answers, expected_id, mixed_jobs, to_record
from tests.integration.kafka_helpers import (
    InProcessWorker,
    committed_offsets,
    decode_replies,
    hold_device,
    produce,
    read_topic,
)

pytestmark = [pytest.mark.integration, pytest.mark.apache_kafka, pytest.mark.kafka_cluster]

PARTITIONS, BEFORE, DURING = 3, 90, 60


async def _fault(cluster, fault: str, topics) -> str:
    """Strike `fault` (see the module docstring); returns what it did, for the report line."""
    if fault == "rolling":
        for node in sorted(cluster.nodes):
            await asyncio.to_thread(cluster.restart, node)
        return "restarted every node in turn"
    if fault == "empty-disk":
        node = await asyncio.to_thread(cluster.leader_of, topics.requests, 0)
        await asyncio.to_thread(cluster.restart, node, True, True)
        return f"node {node} killed and back on an empty disk"
    if fault == "leader":
        node = await asyncio.to_thread(cluster.leader_of, topics.requests, 0)
    else:
        node = await asyncio.to_thread(cluster.group_coordinator, topics.group)
    await asyncio.to_thread(cluster.kill, node)
    return f"killed node {node}"


async def _under_load(cluster, fault: str, run: int, model, scorer, reference, monkeypatch) -> None:
    topics = await cluster_topics(cluster, PARTITIONS)
    bootstrap = topics.broker.bootstrap
    name = scorer.describe().model_name
    before = mixed_jobs(BEFORE, seed=4700 + run, model_name=name, prefix=f"fo-before{run}")
    during = mixed_jobs(DURING, seed=4800 + run, model_name=name, prefix=f"fo-during{run}")
    settings = topics.settings(model, max_batch_tokens=64, rebalance_grace_s=3.0)
    device = hold_device(monkeypatch, scorer)
    async with (
        InProcessWorker(settings, scorer.engine) as one,
        InProcessWorker(settings, scorer.engine) as two,
    ):
        await produce(
            bootstrap, [to_record(s, topics.requests, i % PARTITIONS, True) for i, s in enumerate(before)]
        )
        await topics.read_answers(BEFORE // 4, timeout_s=60)
        device.clear()  # the rest of the backlog stays in flight through the failover
        await asyncio.sleep(1.0)  # answers already computed are acknowledged and committed meanwhile
        at_kill = await committed_offsets(bootstrap, topics.group, topics.requests, PARTITIONS)
        fault_task = asyncio.create_task(_fault(cluster, fault, topics))
        if fault not in ("rolling", "empty-disk"):
            await fault_task
        device.set()
        await produce(
            bootstrap, [to_record(s, topics.requests, i % PARTITIONS, True) for i, s in enumerate(during)]
        )
        done = await fault_task
        await all_up(cluster)
        sent = [*before, *during]
        want = {expected_id(s) for s in sent}
        await read_topic(
            bootstrap, topics.replies, lambda rs: want <= {r.id for r in decode_replies(rs)}, 120
        )
        await asyncio.sleep(1.0)  # late duplicates, if any, land meanwhile
        records = await read_topic(bootstrap, topics.replies, lambda rs: False, timeout_s=1.0)
        assert one.running and two.running, "a worker exited"
        assert await one.stop() == 0 and await two.stop() == 0
    answers = [r for r in decode_replies(records) if r.id in want]
    assert_answers(answers, sent, reference, once=False)
    offsets = {expected_id(s): (i % PARTITIONS, i // PARTITIONS) for i, s in enumerate(before)}
    twice = [job for job, n in Counter(r.id for r in answers).items() if n > 1]
    settled = sorted(
        offsets[j] for j in twice if j in offsets and offsets[j][1] < (at_kill[offsets[j][0]] or 0)
    )
    assert not settled, (
        f"jobs committed before the kill answered again: {settled[:12]} (committed then: {at_kill})"
    )
    print(f"{fault} run {run}: {done}; {len(twice)} jobs answered twice, all in flight at the fault")


@pytest.mark.timeout(240 * RUNS)
@pytest.mark.parametrize("fault", ["leader", "group-coordinator", "rolling", "empty-disk"])
async def test_nodes_fail_under_load(
    kafka_cluster, fault, causal_model, causal_scorer, causal_reference, monkeypatch
) -> None:
    await all_up(kafka_cluster)
    for run in range(RUNS):
        await _under_load(
            kafka_cluster, fault, run, causal_model, causal_scorer, causal_reference, monkeypatch
        )
