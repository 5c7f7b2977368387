"""The worker's intake with the engine and the broker faked: one slow prepare holds back nobody else, a
revoked partition's late prepare is dropped, and nothing raised on the way leaves a ticket unsettled.

The real thing on a broker is tests/integration/test_poison.py; these pin the bookkeeping exactly.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

import msgspec
import pytest
from aiokafka import TopicPartition

from kafka_scorer.config import Settings
from kafka_scorer.wire.protocol import ErrorCode, Job, Result
from kafka_scorer.worker.service import Worker


@dataclass
class Rec:
    topic: str
    partition: int
    offset: int
    value: bytes
    key: bytes | None = None
    timestamp: int = 0
    headers: list[tuple[str, bytes]] = field(default_factory=list)


@dataclass
class Prepared:
    job_id: str
    num_tokens: int = 3


class GatedScorer:
    """`prepare` blocks on a gate for jobs whose id starts with "slow"; "boom" jobs raise."""

    model_name = "fake"

    def __init__(self) -> None:
        self.gate = threading.Event()

    def prepare(self, job: Job, job_id: str) -> Prepared:
        if job_id.startswith("slow"):
            assert self.gate.wait(10), "test never opened the gate"
        if job_id.startswith("boom"):
            raise RuntimeError("tokenizer exploded")
        return Prepared(job_id)

    def pack(self, jobs):  # pragma: no cover - the batcher is replaced
        raise AssertionError

    def run_packed(self, packed):  # pragma: no cover - the batcher is replaced
        raise AssertionError


class FakeBatcher:
    queued_tokens = 0  # the worker's gauge reads it

    def __init__(self, fail: bool = False) -> None:
        self.added: list[str] = []
        self.fail = fail

    def add(self, prepared: Prepared, ticket) -> None:
        if self.fail:
            raise RuntimeError("queue broken")
        self.added.append(prepared.job_id)

    def drain(self, on: bool = True) -> None:  # pragma: no cover - not draining here
        pass

    def close(self) -> None:  # pragma: no cover
        pass


class FakeDelivery:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.answered: list[Result] = []

    async def deliver(self, answers) -> None:
        for answer in answers:
            self.answered.append(answer.result)
            done = answer.ticket.watermark.answered(answer.ticket.offset)
            self.worker._on_settled(answer.ticket, answer.result if done else None)


def _worker(scorer: GatedScorer, batcher: FakeBatcher) -> Worker:
    settings = Settings(_env_file=None, model="unused", metrics_port=0)  # type: ignore[call-arg]
    worker = Worker(settings, scorer)
    worker.batcher = batcher  # type: ignore[assignment]
    worker.delivery = FakeDelivery(worker)  # type: ignore[assignment]
    return worker


def _rec(partition: int, offset: int, job_id: str) -> Rec:
    job = {"id": job_id, "query": [1], "items": [[2]], "label_token_ids": [1]}
    return Rec("jobs", partition, offset, msgspec.json.encode(job))


async def _until(condition, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


async def _close(scorer: GatedScorer, worker: Worker) -> None:
    scorer.gate.set()
    worker._prepare_pool.shutdown(wait=True)
    await worker.consumer.stop()
    await worker.producer.stop()


TP0, TP1 = TopicPartition("jobs", 0), TopicPartition("jobs", 1)


async def test_a_slow_prepare_holds_back_no_other_job_in_its_poll_or_later_polls() -> None:
    scorer, batcher = GatedScorer(), FakeBatcher()
    worker = _worker(scorer, batcher)
    try:
        await worker._accept({TP0: [_rec(0, 0, "slow-0")], TP1: [_rec(1, 0, "fast-0")]})
        await worker._accept({TP1: [_rec(1, 1, "fast-1")]})
        await _until(lambda: batcher.added == ["fast-0", "fast-1"])
        assert worker.inflight_jobs == 3  # the slow one is still in flight, and counted
        assert worker.tracker.watermark(TP0).commit_offset() == 0  # no commit passes the slow record
        scorer.gate.set()
        await _until(lambda: "slow-0" in batcher.added)
        assert worker.inflight_tokens == 9
    finally:
        await _close(scorer, worker)


async def test_a_prepare_finishing_after_its_partition_was_revoked_is_dropped() -> None:
    scorer, batcher = GatedScorer(), FakeBatcher()
    worker = _worker(scorer, batcher)
    try:
        await worker._accept({TP0: [_rec(0, 0, "slow-0")]})
        worker.tracker.revoke([TP0])
        scorer.gate.set()
        await _until(lambda: worker.inflight_jobs == 0)
        assert batcher.added == [] and worker.delivery.answered == []  # type: ignore[union-attr]
        assert worker.metrics.dropped._value.get() == 1
    finally:
        await _close(scorer, worker)


@pytest.mark.parametrize(
    ("job_id", "fail_queue", "needle"), [("boom-0", False, "prepare failed"), ("ok-0", True, "queueing")]
)
async def test_an_exception_in_prepare_or_queueing_is_the_jobs_internal_answer(
    job_id, fail_queue, needle
) -> None:
    scorer, batcher = GatedScorer(), FakeBatcher(fail=fail_queue)
    worker = _worker(scorer, batcher)
    try:
        await worker._accept({TP0: [_rec(0, 0, job_id)], TP1: [_rec(1, 0, "fine")]})
        await _until(lambda: worker.inflight_jobs == (1 if not fail_queue else 0))
        answered = worker.delivery.answered  # type: ignore[union-attr]
        failed = [r for r in answered if r.id == job_id]
        assert len(failed) == 1 and failed[0].error is not None
        assert failed[0].error.code is ErrorCode.INTERNAL and needle in failed[0].error.message
        assert worker.tracker.watermark(TP0).commit_offset() == 1  # answered, so committable
    finally:
        await _close(scorer, worker)
