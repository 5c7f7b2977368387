"""The quickstart's broker restart (issue 26): `kafka-scorer broker --port P` stopped with Ctrl-C under a
running worker and started again with the same command, while a producer keeps sending through the
outage. Before the fix the worker re-scored the same jobs every ~200 ms until stopped (one job answered
138 times): the restarted broker reported a log end of 2 for a partition holding offsets 0-10 (records
retried into it before its topics existed), and the reset check believed it on every poll.

Here every job the restarted broker acknowledged is answered, none more than the at-least-once bound
allows (twice, and only jobs in flight at the restart), the worker reports no wrong log end and no
refused reset, and once everything is answered no further answer appears: there is no loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from kafka_scorer.embedded.broker import free_port
from tests.integration.jobs import assert_answers, expected_id, mixed_jobs, to_record
from tests.integration.kafka_helpers import (
    BrokerInfo,
    InProcessWorker,
    decode_replies,
    produce,
    read_topic,
    unique,
    worker_settings,
)
from tests.integration.processes import start, stop, stopped_at_exit, wait_for

pytestmark = pytest.mark.integration

PARTITIONS = 4  # the broker's default: what it gives auto-created topics too
BEFORE, THROUGH, AFTER = 40, 24, 40
QUIET_S = 1.0  # after everything is answered (and the read's 1 s settle): the loop answered every ~200 ms


def _assignments(caplog: pytest.LogCaptureFixture) -> int:
    return sum("partitions assigned" in r.getMessage() for r in caplog.records)


async def _rejoined(caplog: pytest.LogCaptureFixture, before: int, timeout_s: float = 30.0) -> None:
    """Until the worker has its partitions again from the restarted broker's group (which knows no
    member: the worker's heartbeat finds its membership lost, and it rejoins). A job sent earlier may
    be answered on the old membership and again after the rejoin, as at-least-once allows; one sent
    after is answered once."""
    deadline = time.monotonic() + timeout_s
    while _assignments(caplog) <= before:
        assert time.monotonic() < deadline, "the worker never rejoined the restarted broker's group"
        await asyncio.sleep(0.1)


def _metric(text: str, line_start: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(line_start))


async def test_a_broker_restart_as_the_quickstart_does_answers_each_job_and_never_loops(
    tmp_path: Path, causal_model, causal_scorer, causal_reference, caplog
) -> None:
    caplog.set_level(logging.INFO, logger="kafka_scorer.worker.rebalance")
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    requests, replies = unique("req"), unique("res")
    command = ("broker", "--port", str(port), "--topic", requests, "--topic", replies)
    broker = start(*command, log=tmp_path / "broker.log")
    with stopped_at_exit(broker) as procs:
        wait_for(tmp_path / "broker.log", "broker ready", broker, timeout_s=30)
        info = BrokerInfo(bootstrap, "tansu", transactions=False, min_session_timeout_ms=0)
        settings = worker_settings(
            info, causal_model, request_topics=[requests], reply_topic=replies, group_id=unique("group")
        )
        name = causal_scorer.describe().model_name
        before = mixed_jobs(BEFORE, seed=61, model_name=name, prefix="before")
        through = mixed_jobs(THROUGH, seed=62, model_name=name, prefix="through")
        after = mixed_jobs(AFTER, seed=63, model_name=name, prefix="after")

        async with InProcessWorker(settings, causal_scorer.engine) as worker:
            await produce(
                bootstrap, [to_record(s, requests, i % PARTITIONS, True) for i, s in enumerate(before)]
            )
            await read_topic(bootstrap, replies, lambda rs: len(rs) >= BEFORE, timeout_s=60)
            producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
            await producer.start()
            assigned = _assignments(caplog)
            assert stop(broker) == 0  # Ctrl-C in the broker's terminal
            sends = [  # the producer keeps sending through the outage; it retries into the new broker
                asyncio.ensure_future(producer.send_and_wait(r.topic, r.value, key=r.key, headers=r.headers,
                                                             partition=r.partition))
                for r in (to_record(s, requests, i % PARTITIONS, True) for i, s in enumerate(through))
            ]  # fmt: skip
            await asyncio.sleep(2.0)
            broker = start(*command, log=tmp_path / "broker-again.log")  # the same command again
            procs.append(broker)
            await asyncio.to_thread(wait_for, tmp_path / "broker-again.log", "broker ready", broker, 30)
            acked = await asyncio.gather(*sends, return_exceptions=True)
            await producer.stop()
            await _rejoined(caplog, assigned)
            await produce(
                bootstrap, [to_record(s, requests, i % PARTITIONS, True) for i, s in enumerate(after)]
            )

            delivered = [
                s for s, ack in zip(through, acked, strict=True) if not isinstance(ack, BaseException)
            ]
            want = {expected_id(s) for s in [*delivered, *after]}
            records = await read_topic(
                bootstrap, replies, lambda rs: want <= {r.id for r in decode_replies(rs)}, timeout_s=90
            )
            answered = decode_replies(records)
            await asyncio.sleep(QUIET_S)
            later = decode_replies(
                await read_topic(bootstrap, replies, lambda rs: True, timeout_s=30, settle_s=1)
            )
            assert worker.running
            assert await worker.stop() == 0
        metrics = worker.worker.metrics.render().decode()

    counts = Counter(r.id for r in answered)
    print(
        f"broker restart: {len(delivered)} of {THROUGH} sent through the outage acknowledged, "
        f"{len(want)} jobs to answer, {sum(counts.values())} answers, {len(later)} after {QUIET_S:.0f}s"
        f" more; log resets {_metric(metrics, 'kafka_scorer_log_resets_total')}"
    )
    assert want <= set(counts), f"never answered: {sorted(want - set(counts))[:10]}"
    assert set(counts) <= {expected_id(s) for s in [*through, *after]}, counts  # the old log is gone
    assert_answers(answered, [*through, *after], causal_reference, expected=set(counts), once=False)
    assert all(counts[expected_id(s)] == 1 for s in after), counts  # sent after the rejoin: once each
    assert max(counts.values()) <= 2 and sum(counts.values()) - len(counts) <= len(delivered), counts
    assert len(later) == len(answered), "answers kept coming after everything was answered: a loop"
    resets = [r.getMessage() for r in caplog.records if "beyond the log end" in r.getMessage()
              or "moved back" in r.getMessage()]  # fmt: skip
    assert len(resets) <= PARTITIONS, resets  # at most once per partition, never again and again
    assert _metric(metrics, 'kafka_scorer_log_resets_total{outcome="contradicted"}') == 0
    assert _metric(metrics, 'kafka_scorer_log_resets_total{outcome="refused"}') == 0
