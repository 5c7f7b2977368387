"""Contender (d): the full worker through a real Kafka-protocol broker (embedded tansu).

Kept apart from the in-process contenders because it is a different world: an event loop, a broker
child process, a consumer group to join, JSON over Kafka. What it shares with them is the meaning of
the figures: the same jobs, the same closed-loop window, the same `RunProbe`, the same `RunRecord`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterator, Sequence

import msgspec

from kafka_scorer.wire.protocol import Job
from kafka_scorer_bench.contenders import warmup_jobs
from kafka_scorer_bench.probes import Measured, RunProbe
from kafka_scorer_bench.records import RunLog, RunRecord, error_text, repeated_async

QUICK_GROUP = {"session_timeout_ms": 1500, "heartbeat_interval_ms": 300}
"""Group timing with `--quick`: tansu settles a group join after about the session timeout, so the
worker's defaults (10 s) made each quick turn of (d) mostly a wait to join; a quick run is not judged on
its figures, and the join comes before the timed runs either way. 1.5 s / 0.3 s: what the test suite
runs its workers at on tansu (docs/worker.md, "The embedded brokers")."""


def run_worker_contender(
    scorer,
    jobs: Sequence[Job],
    window: int,
    probe: RunProbe,
    repeats: int = 1,
    budget_s: float = 0.0,
    quick: bool = False,
) -> RunRecord:
    """(d): an embedded tansu broker, the real `Worker` in this process on the same `Scorer`, and a
    closed-loop aiokafka client with the same window as the in-process contenders."""
    group = QUICK_GROUP if quick else {}
    with _quiet_loggers("aiokafka", "kafka_scorer.kafka", "kafka_scorer.worker"):
        return asyncio.run(_worker_run(scorer, list(jobs), window, probe, repeats, budget_s, group))


@contextlib.contextmanager
def _quiet_loggers(*names: str) -> Iterator[None]:
    """Expected warnings (tansu refusing the idempotent producer) would break up the table; errors stay."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


async def _worker_run(
    scorer, jobs: list[Job], window: int, probe: RunProbe, repeats: int, budget_s: float, group: dict
) -> RunRecord:
    from kafka_scorer.config import Settings
    from kafka_scorer.embedded.broker import EmbeddedBroker
    from kafka_scorer.kafka.admin import create_topics
    from kafka_scorer.kafka.connection import new_consumer, new_producer
    from kafka_scorer.kafka.records import TopicPartition
    from kafka_scorer.worker.service import Worker

    requests, replies, partitions = "bench.requests", "bench.results", 4
    async with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap_servers
        await create_topics(bootstrap, [requests, replies], partitions)
        settings = Settings(
            model=scorer.describe().model_name,
            bootstrap_servers=bootstrap,
            request_topics=[requests],
            reply_topic=replies,
            group_id="kafka-scorer-bench",
            metrics_port=0,
            max_batch_tokens=scorer.engine.max_batch_tokens,
            max_inflight_tokens=max(65536, 4 * scorer.engine.max_batch_tokens),
            # The worker's default. tansu answers a waiting fetch only at its deadline (BROKERS.md), so a
            # short wait (the tests use 10 ms) turns both clients into busy pollers; on 2 cores that CPU
            # comes out of the forward pass (measured: many-items compute 3.6 s at 200 ms, 4.0 s at 10 ms).
            fetch_max_wait_ms=100,
            # session and heartbeat at the worker's defaults: (d) measures the worker as deployed, and
            # ten heartbeats a second are wake-ups that come out of the forward pass on a small CPU
            # (a quick run joins faster: QUICK_GROUP)
            **group,
            shutdown_grace_s=10.0,
            log_level="WARNING",
        )
        worker = Worker(settings, scorer.engine)
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        producer = new_producer(None, bootstrap_servers=bootstrap, acks="all", max_request_size=16 << 20)
        consumer = new_consumer(
            None,
            bootstrap_servers=bootstrap,
            enable_auto_commit=False,
            fetch_max_wait_ms=100,
            max_partition_fetch_bytes=16 << 20,
        )
        await producer.start()
        await consumer.start()
        try:
            deadline = time.monotonic() + 60
            while not (worker.ready and worker.consumer.assignment()):
                if task.done():
                    raise RuntimeError(f"the bench worker stopped at start (exit {task.result()})")
                if time.monotonic() > deadline:
                    raise RuntimeError("the bench worker did not join its consumer group in 60 s")
                await asyncio.sleep(0.05)
            reply_parts = [TopicPartition(replies, p) for p in range(partitions)]
            consumer.assign(reply_parts)
            await consumer.seek_to_end(*reply_parts)
            client = _KafkaClient(producer, consumer, requests)
            await client.run("warmup", warmup_jobs(jobs), window, None)
            return await repeated_async(
                lambda i: client.run(f"timed{i}", jobs, window, probe), repeats, budget_s
            )
        finally:
            await consumer.stop()
            await producer.stop()
            stop.set()
            await asyncio.wait_for(task, 60)


class _KafkaClient:
    """Closed loop over Kafka: `window` jobs outstanding, the next produced as each answer arrives."""

    def __init__(self, producer, consumer, topic: str) -> None:
        self.producer = producer
        self.consumer = consumer
        self.topic = topic

    async def run(self, tag: str, jobs: list[Job], window: int, probe: RunProbe | None) -> RunRecord:
        from kafka_scorer.wire.protocol import CONTENT_TYPE_JSON, decode_result, encode_job

        n = len(jobs)
        log = RunLog(n)
        tokens = rows = 0
        sent = answered = 0
        with probe.measure() if probe is not None else contextlib.nullcontext(Measured()) as peak:
            start, cpu_start = time.perf_counter(), time.thread_time()

            async def fill() -> None:
                nonlocal sent
                while sent - answered < window and sent < n:
                    wire = msgspec.structs.replace(jobs[sent], id=f"{tag}-{sent}")
                    log.submit(sent)
                    await self.producer.send(
                        self.topic, encode_job(wire), headers=[("content-type", CONTENT_TYPE_JSON.encode())]
                    )
                    sent += 1

            await fill()
            deadline = time.monotonic() + 600
            while answered < n:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"worker answered {answered} of {n} jobs in 600 s")
                batch = await self.consumer.getmany(timeout_ms=100)
                now = time.perf_counter()
                for records in batch.values():
                    for record in records:
                        result = decode_result(record.value)
                        prefix, _, index_text = result.id.rpartition("-")
                        if prefix != tag:
                            continue
                        index = int(index_text)
                        if log.answered(index):
                            continue  # a redelivered duplicate (at-least-once)
                        log.answer(index, result.scores, error_text(result), now)
                        tokens += result.prompt_tokens
                        if result.scores and jobs[index].label_token_ids and not jobs[index].apply_softmax:
                            rows += len(jobs[index].items)
                        answered += 1
                await fill()
            wall, loop_cpu = time.perf_counter() - start, time.thread_time() - cpu_start
        return dataclasses.replace(log.record(wall, tokens, rows, peak), loop_cpu_s=loop_cpu)
