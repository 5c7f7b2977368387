"""`kafka-scorer bench --workload backlog`: interactive jobs arriving behind a bulk backlog, with
priority lanes on and off, side by side in one run (issue 18).

Each run: a fresh pair of request topics on one embedded broker, the bulk topic filled with the whole
backlog first; the real `Worker` in this process reads both. Once the backlog is being worked through,
interactive jobs go to their own topic at a fixed rate (open loop), each with `timeout_ms`. Reported per
run: the interactive latency (produce to result) p50/p99/max, how many expired, when the backlog was
done, and the mean forward pass, the unit the goal is stated in. Lanes on: `topic_priorities` puts the
interactive topic above the bulk one (scheduling=priority); lanes off: scheduling=fifo, no priorities.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafka_scorer.wire.engine_stats import EngineStats
from kafka_scorer.wire.protocol import ErrorCode, Job, Result, decode_result, encode_job
from kafka_scorer_bench.models import FIRST_REGULAR_ID, SHAPES, build_shaped_model
from kafka_scorer_bench.worker_contender import QUICK_GROUP


@dataclass(frozen=True)
class BacklogSpec:
    bulk_jobs: int
    live_jobs: int
    rate_hz: float
    timeout_ms: int
    query_len: int
    num_items: int
    item_len: int
    max_batch_tokens: int


FULL = BacklogSpec(700, 30, 2.0, 20_000, 32, 8, 16, 2048)
QUICK = BacklogSpec(300, 10, 20.0, 10_000, 8, 4, 4, 256)
GOAL_BATCHES = 2.0  # lanes on: interactive p99 within about two forward passes
GOAL_RATIO = 5.0  # ... and at least this much lower than with lanes off


class _TimedEngine:
    """The engine, timing each forward (the goal's unit) without changing what it computes."""

    def __init__(self, scorer: Any) -> None:
        self.engine = scorer.engine
        self.served = self.engine.served
        self.max_batch_tokens = self.engine.max_batch_tokens
        self.forward_s: list[float] = []

    def prepare(self, job: Job, job_id: str) -> Any:
        return self.engine.prepare(job, job_id)

    def pack(self, jobs: Any) -> Any:
        return self.engine.pack(jobs)

    def run_packed(self, packed: Any) -> list[Result]:
        started = time.perf_counter()
        try:
            return self.engine.run_packed(packed)
        finally:
            self.forward_s.append(time.perf_counter() - started)

    def stats(self) -> EngineStats:
        return self.engine.stats()


def run_backlog_bench(
    *, device: str, dtype: str, model_shape: str | None, quick: bool, seed: int, model_dir: str | None
) -> dict:
    import tempfile

    from kafka_scorer.engine.api import Scorer

    spec = QUICK if quick else FULL
    shape = SHAPES[model_shape or ("tiny" if quick else "cpu-small")]
    with tempfile.TemporaryDirectory(prefix="kafka-scorer-backlog-") as tmp:
        root = Path(model_dir or tmp)
        path = build_shaped_model(root / f"{shape.name}-causal", shape, "causal")
        scorer = Scorer(str(path), dtype=dtype, device=device, max_batch_tokens=spec.max_batch_tokens)
        scorer.engine.warm_up()
        rng = random.Random(f"backlog:{seed}")
        labels = [rng.randrange(FIRST_REGULAR_ID, shape.vocab_size) for _ in range(2)]

        def job(job_id: str) -> Job:
            tokens = lambda n: [rng.randrange(FIRST_REGULAR_ID, shape.vocab_size) for _ in range(n)]  # noqa: E731
            items = [tokens(spec.item_len) for _ in range(spec.num_items)]
            return Job(id=job_id, query=tokens(spec.query_len), items=items, label_token_ids=labels)

        bulk = [job(f"bulk-{i}") for i in range(spec.bulk_jobs)]
        live = [job(f"live-{i}") for i in range(spec.live_jobs)]
        runs = asyncio.run(_both(scorer, spec, bulk, live, QUICK_GROUP if quick else {}))
    on, off = runs["lanes on"], runs["lanes off"]
    ratio = off["p99_s"] / on["p99_s"] if on["p99_s"] else None
    return {
        "spec": spec.__dict__,
        "model_shape": shape.name,
        "runs": runs,
        "p99_off_over_on": ratio,
        "p99_on_in_forwards": on["p99_s"] / on["forward_mean_s"] if on["forward_mean_s"] else None,
        "goal": {"p99_on_forwards_at_most": GOAL_BATCHES, "p99_ratio_at_least": GOAL_RATIO},
    }


async def _both(scorer: Any, spec: BacklogSpec, bulk: list[Job], live: list[Job], group: dict) -> dict:
    from kafka_scorer.embedded.broker import EmbeddedBroker

    async with EmbeddedBroker() as broker:
        runs = {}
        for name, lanes in (("lanes on", True), ("lanes off", False)):
            runs[name] = await _run(broker.bootstrap_servers, scorer, spec, bulk, live, lanes, name, group)
        return runs


async def _run(
    bootstrap: str,
    scorer: Any,
    spec: BacklogSpec,
    bulk: list[Job],
    live: list[Job],
    lanes: bool,
    tag: str,
    group: dict,
) -> dict:
    from kafka_scorer.config import Settings
    from kafka_scorer.kafka.admin import create_topics
    from kafka_scorer.kafka.connection import new_consumer, new_producer
    from kafka_scorer.kafka.records import TopicPartition
    from kafka_scorer.worker.service import Worker

    suffix = "on" if lanes else "off"
    bulk_t, live_t, replies = f"backlog.bulk.{suffix}", f"backlog.live.{suffix}", f"backlog.results.{suffix}"
    await create_topics(bootstrap, [bulk_t, live_t, replies], 1)
    producer = new_producer(None, bootstrap_servers=bootstrap, acks="all", max_request_size=16 << 20)
    consumer = new_consumer(None, bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=20)
    await producer.start()
    await consumer.start()
    engine = _TimedEngine(scorer)
    settings = Settings(
        model=scorer.describe().model_name,
        bootstrap_servers=bootstrap,
        request_topics=[bulk_t, live_t],
        reply_topic=replies,
        group_id=f"backlog-{suffix}",
        metrics_port=0,
        max_batch_tokens=spec.max_batch_tokens,
        scheduling="priority" if lanes else "fifo",
        topic_priorities={bulk_t: -1, live_t: 1} if lanes else {},
        log_level="WARNING",
        **group,  # QUICK_GROUP with --quick: the join is in each run's time, and not its subject
    )
    worker = Worker(settings, engine)
    stop = asyncio.Event()
    try:
        reply_part = TopicPartition(replies, 0)
        consumer.assign([reply_part])
        await consumer.seek_to_end(reply_part)
        await asyncio.gather(*[await producer.send(bulk_t, encode_job(j)) for j in bulk])
        started = time.perf_counter()
        task = asyncio.create_task(worker.run(stop))
        answers = _Answers(consumer)
        # One reader for the whole run, so an answer's time is when it arrived, also while sending.
        reading = asyncio.create_task(answers.until(lambda got: len(got) >= len(bulk) + len(live), task, 900))
        while not any(i.startswith("bulk-") for i in answers.at):  # the backlog is being worked through
            if reading.done():
                reading.result()
            await asyncio.sleep(0.01)
        sent_at = await _send_live(producer, live_t, live, spec)
        await reading
    finally:
        stop.set()
        await producer.stop()
        await consumer.stop()
    await asyncio.wait_for(task, 60)
    return _summary(answers, sent_at, started, engine, tag)


async def _send_live(producer: Any, topic: str, live: list[Job], spec: BacklogSpec) -> dict[str, float]:
    """Open loop: one interactive job every 1 / rate seconds, whatever the worker is doing."""
    import msgspec

    sent_at = {}
    for job in live:
        timed = msgspec.structs.replace(job, timeout_ms=spec.timeout_ms)
        sent_at[job.id] = time.perf_counter()
        await producer.send_and_wait(topic, encode_job(timed))
        await asyncio.sleep(1 / spec.rate_hz)
    return sent_at


class _Answers:
    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        self.at: dict[str, float] = {}
        self.results: dict[str, Result] = {}

    async def until(self, done, task: asyncio.Task, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not done(self.at):
            if task.done():
                raise RuntimeError(f"the bench worker stopped (exit {task.result()})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(self.at)} answers in {timeout_s:.0f} s")
            batch = await self.consumer.getmany(timeout_ms=50)
            now = time.perf_counter()
            for records in batch.values():
                for record in records:
                    result = decode_result(record.value)
                    self.at.setdefault(result.id, now)
                    self.results.setdefault(result.id, result)


def _summary(
    answers: _Answers, sent_at: dict[str, float], started: float, engine: _TimedEngine, tag: str
) -> dict:
    latencies = sorted(answers.at[i] - sent_at[i] for i in sent_at)
    expired = sum(
        1
        for i in sent_at
        if answers.results[i].error is not None
        and answers.results[i].error.code is ErrorCode.DEADLINE_EXCEEDED
    )
    bulk_done = max(at for i, at in answers.at.items() if i.startswith("bulk-")) - started
    p99 = latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))]
    return {
        "label": tag,
        "p50_s": statistics.median(latencies),
        "p99_s": p99,
        "max_s": latencies[-1],
        "expired": expired,
        "bulk_done_s": bulk_done,
        "forwards": len(engine.forward_s),
        "forward_mean_s": statistics.fmean(engine.forward_s) if engine.forward_s else 0.0,
    }


def format_backlog_report(report: dict) -> str:
    spec = report["spec"]
    lines = [
        f"backlog: {spec['bulk_jobs']} bulk jobs queued first, then {spec['live_jobs']} interactive jobs at "
        f"{spec['rate_hz']:g}/s with timeout_ms {spec['timeout_ms']} (each {spec['query_len']} + "
        f"{spec['num_items']} x {spec['item_len']} tokens), model shape {report['model_shape']}, budget "
        f"{spec['max_batch_tokens']} tokens",
        f"{'':12}{'interactive p50 s':>18}{'p99 s':>9}{'max s':>9}{'expired':>9}{'backlog done s':>16}"
        f"{'forwards':>10}{'forward s':>11}",
    ]
    for name, r in report["runs"].items():
        lines.append(
            f"{name:<12}{r['p50_s']:>18.2f}{r['p99_s']:>9.2f}{r['max_s']:>9.2f}{r['expired']:>9}"
            f"{r['bulk_done_s']:>16.1f}{r['forwards']:>10}{r['forward_mean_s']:>11.3f}"
        )
    ratio, forwards = report["p99_off_over_on"], report["p99_on_in_forwards"]
    goal = report["goal"]
    lines.append(
        f"interactive p99, lanes off / lanes on: {ratio:.1f}x (goal >= {goal['p99_ratio_at_least']:g}x); "
        f"lanes on p99 = {forwards:.1f} mean forward passes "
        f"(goal about <= {goal['p99_on_forwards_at_most']:g})"
    )
    return "\n".join(lines)
