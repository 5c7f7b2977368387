"""Two of the three nodes down under load (issue 45): the worker waits, says so, skips nothing, resumes.

With two nodes gone no partition has the two in-sync replicas `min.insync.replicas=2` asks for (and the
controller quorum is lost, so the survivor cannot even shrink its ISR): every reply sent with acks=all
fails or waits out its request timeout, and no offset can be committed. The cluster still answers
metadata, so the broker watch saw nothing and `/readyz` stayed green; the worker now reports a send
unacknowledged for `STALL_S` (kafka/send_stall.py) in `/readyz` and in the
`kafka_scorer_send_stalled_seconds` gauge.

Asserted: the worker reports the stall within `REPORTED_S` of the nodes going, never exits, commits
nothing ahead of an answer (every job acknowledged before the fault is answered, as the reference scores
it, after the nodes return), answers twice only jobs in flight at the fault, and is ready again.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from kafka_scorer.kafka.send_stall import STALL_S
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

PARTITIONS, JOBS = 3, 60
REPORTED_S = STALL_S + 20  # the stall bound, plus the worker's answers reaching the producer
GAUGE = "kafka_scorer_send_stalled_seconds"


async def _in_flight(worker: InProcessWorker, timeout_s: float) -> None:
    """Until the worker holds jobs it has not answered: with nothing to send, nothing can stall."""
    deadline = time.monotonic() + timeout_s
    while not worker.worker.metrics.registry.get_sample_value("kafka_scorer_inflight_jobs"):
        assert time.monotonic() < deadline, "no job in flight"
        await asyncio.sleep(0.1)


async def _reported(worker: InProcessWorker, timeout_s: float) -> tuple[float, str, float]:
    """Seconds until `/readyz` turns red, its reason, and the gauge then; the worker must stay up."""
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        assert worker.running, "the worker exited while two nodes were down"
        reason = worker.worker.not_ready()
        if reason is not None:
            gauge = worker.worker.metrics.registry.get_sample_value(GAUGE) or 0.0
            return time.monotonic() - began, reason, gauge
        await asyncio.sleep(0.2)
    raise AssertionError(f"/readyz stayed green {timeout_s:.0f}s with two of three nodes down")


async def _offline(cluster, run: int, model, scorer, reference, monkeypatch) -> str:
    topics = await cluster_topics(cluster, PARTITIONS)
    bootstrap = topics.broker.bootstrap
    sent = mixed_jobs(JOBS, seed=5100 + run, model_name=scorer.describe().model_name, prefix=f"off{run}")
    settings = topics.settings(model, max_batch_tokens=64, rebalance_grace_s=3.0)
    device = hold_device(monkeypatch, scorer)
    async with InProcessWorker(settings, scorer.engine) as worker:
        device.clear()  # every job stays in flight, to be answered once the nodes are gone
        await produce(
            bootstrap, [to_record(s, topics.requests, i % PARTITIONS, True) for i, s in enumerate(sent)]
        )
        await _in_flight(worker, 30)
        at_kill = await committed_offsets(bootstrap, topics.group, topics.requests, PARTITIONS)
        keep = await asyncio.to_thread(cluster.leader_of, topics.replies, 0)
        for node in sorted(set(cluster.nodes) - {keep}):
            await asyncio.to_thread(cluster.kill, node)
        device.set()
        took, reason, gauge = await _reported(worker, REPORTED_S)
        assert "not acknowledged" in reason or "unreachable" in reason, reason
        await asyncio.sleep(5.0)  # the worker keeps waiting, and keeps running
        await all_up(cluster)
        want = {expected_id(s) for s in sent}
        records = await read_topic(
            bootstrap, topics.replies, lambda rs: want <= {r.id for r in decode_replies(rs)}, 180
        )
        await worker.wait_ready(60)
        assert worker.running, "the worker exited"
        assert await worker.stop() == 0
    answers = [r for r in decode_replies(records) if r.id in want]
    assert_answers(answers, sent, reference, once=False)
    offsets = {expected_id(s): (i % PARTITIONS, i // PARTITIONS) for i, s in enumerate(sent)}
    twice = [job for job, n in Counter(r.id for r in answers).items() if n > 1]
    settled = [offsets[j] for j in twice if offsets[j][1] < (at_kill[offsets[j][0]] or 0)]
    assert not settled, f"jobs committed before the fault answered again: {settled[:12]}"
    return f"run {run}: reported after {took:.1f}s ({reason[:90]}…; gauge {gauge:.0f}s); {len(twice)} twice"


@pytest.mark.timeout(300 * RUNS)
async def test_two_nodes_down(
    kafka_cluster, causal_model, causal_scorer, causal_reference, monkeypatch
) -> None:
    await all_up(kafka_cluster)
    for run in range(RUNS):
        print(await _offline(kafka_cluster, run, causal_model, causal_scorer, causal_reference, monkeypatch))


async def _reply_topic_with(bootstrap: str, name: str, configs: dict[str, str]) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, PARTITIONS, 3, topic_configs=configs)])
    finally:
        await admin.close()


async def _set_topic_config(bootstrap: str, name: str, configs: dict[str, str]) -> None:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, name, configs)])
    finally:
        await admin.close()


@pytest.mark.timeout(180)
async def test_min_insync_at_the_replication_factor_is_named(
    kafka_cluster, causal_model, causal_scorer, caplog
) -> None:
    """The operator's mistake: a reply topic with `min.insync.replicas` equal to its replication factor
    (3), so one node down stops every acks=all write to it. (Kafka 4.1 caps a value above the
    replication factor at it: min.insync.replicas=4 on 3 replicas accepts writes, measured.) The worker
    must say so in one line naming the setting and the fix, turn `/readyz` red, and answer once the
    setting is fixed, the node still down."""
    await all_up(kafka_cluster)
    topics = await cluster_topics(kafka_cluster, PARTITIONS)
    bootstrap = topics.broker.bootstrap
    replies = topics.replies + "-strict"
    await _reply_topic_with(bootstrap, replies, {"min.insync.replicas": "3"})
    sent = mixed_jobs(3, seed=5200, model_name=causal_scorer.describe().model_name, prefix="strict")
    settings = topics.settings(causal_model, reply_topic=replies)
    async with InProcessWorker(settings, causal_scorer.engine) as worker:
        busy = {
            await asyncio.to_thread(kafka_cluster.leader_of, replies, 0),
            await asyncio.to_thread(kafka_cluster.group_coordinator, topics.group),
        }
        await asyncio.to_thread(kafka_cluster.kill, min(set(kafka_cluster.nodes) - busy))
        await produce(bootstrap, [to_record(s, topics.requests, 0, True) for s in sent])
        took, reason, _gauge = await _reported(worker, REPORTED_S + 10)
        assert "min.insync.replicas" in reason, reason
        lines: list[str] = []
        deadline = time.monotonic() + 30.0  # the refusal line follows the first NotEnoughReplicas answer
        while not lines and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            lines = [r.getMessage() for r in caplog.records if "results refused" in r.getMessage()]
        assert len(lines) == 1 and "kafka-configs" in lines[0] and replies in lines[0], lines
        await _set_topic_config(bootstrap, replies, {"min.insync.replicas": "2"})
        want = {expected_id(s) for s in sent}
        await read_topic(bootstrap, replies, lambda rs: want <= {r.id for r in decode_replies(rs)}, 90)
        await worker.wait_ready(30)
        assert await worker.stop() == 0
    await all_up(kafka_cluster)
    print(f"min.insync.replicas=3 on 3 replicas, one node down: /readyz red after {took:.1f}s; {lines[0]}")
