"""The worker's unit-test fakes, written once: a consumed record, the engine, the producer and the
consumer as the worker's parts see them. Integration tests (tests/integration) use the real broker and
the real engine instead; these pin the worker's own rules exactly and fast."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import msgspec
import pytest
from aiokafka import TopicPartition

from kafka_scorer.config import Settings
from kafka_scorer.engine.failures import failed_results, is_fatal
from kafka_scorer.kafka.producer import Refused
from kafka_scorer.kafka.records import OutRecord
from kafka_scorer.wire.engine_stats import EngineStats
from kafka_scorer.wire.protocol import ErrorCode, Job, Result, error_result
from kafka_scorer.wire.provenance import ServedModel
from kafka_scorer.worker.envelope import Origin
from kafka_scorer.worker.ledger import Ledger
from kafka_scorer.worker.metrics import WorkerMetrics
from kafka_scorer.worker.ticket import Ticket

TP = TopicPartition("requests", 0)
DEFAULT_REPLY_TOPIC = "replies"


@dataclass
class Rec:
    """A consumed record: the parts of aiokafka's ConsumerRecord the worker reads."""

    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    key: bytes | None = b"k1"
    topic: str = "jobs"
    partition: int = 2
    offset: int = 41
    timestamp: int = 1_700_000_000_000


@dataclass
class FakePrepared:
    job_id: str
    num_tokens: int = 3
    tokens: tuple[int, ...] = ()
    """The job's token ids (query, then items), what a forward's fault sees (`FakeEngine.fault`)."""
    rows: int = 1
    """One score row per item."""


Fault = Callable[[Sequence[int]], None]
"""Called with a forward's token ids before it runs; raises to make that forward fail."""


class FakeEngine:
    """The engine seam (worker/engine.py) without a model, keeping the engine contract
    (tests/engine/contract.py) so the worker's tests stand on what a real engine does.

    `prepare` answers a job for another model (`model_mismatch`), one over `max_items_per_job`
    (`too_long`) and a ranking (`top_n`, the rerank shape: `unsupported`) with an error result; it
    blocks on `gate` for jobs whose id starts with "slow" and raises (a bug) for "boom" jobs. `pack`
    and `run_packed` record their threads and calls, optionally take `compute_s`, and raise when told
    to (`fail`, `fail_pack`). A forward that `fault` makes raise is run again in halves, as the engine's
    bisection does, until the job behind it is answered `internal` alone; a poisoned device is raised.
    Every item scores `[1.0]`; every result carries `served`'s provenance."""

    def __init__(self, compute_s: float = 0.0, fail: bool = False, fail_pack: bool = False) -> None:
        self.served = ServedModel("fake", "rev-fake", "float32")
        self.max_batch_tokens = 8192
        self.max_items_per_job = 16
        self.fault: Fault | None = None
        self.counters = EngineStats()
        """What `stats` reports (a test sets caches' counters here)."""
        self.gate = threading.Event()
        self.calls: list[list[str]] = []
        self.prepared: list[str] = []
        self.threads: set[str] = set()
        self.pack_threads: set[str] = set()
        self.compute_s = compute_s
        self.fail = fail
        self.fail_pack = fail_pack
        self._active = 0
        self.max_active = 0
        self._lock = threading.Lock()

    def prepare(self, job: Job, job_id: str) -> FakePrepared | Result:
        self.prepared.append(job_id)
        if job_id.startswith("slow"):
            assert self.gate.wait(10), "test never opened the gate"
        if job_id.startswith("boom"):
            raise RuntimeError("tokenizer exploded")
        refusal = self._refusal(job)
        if refusal is not None:
            return self.served.stamp(error_result(job_id, *refusal))
        items = job.inputs
        tokens = [*_ids(job.query), *(i for item in items for i in _ids(item))]
        return FakePrepared(job_id, tokens=tuple(tokens), rows=len(items))

    def _refusal(self, job: Job) -> tuple[ErrorCode, str] | None:
        if job.model is not None and job.model != self.served.name:
            return ErrorCode.MODEL_MISMATCH, f"job asks for model {job.model!r}; this is {self.served.name!r}"
        if job.documents is not msgspec.UNSET or job.top_n is not None:
            return ErrorCode.UNSUPPORTED, "the fake engine ranks nothing (top_n, documents)"
        if len(job.inputs) > self.max_items_per_job:
            return ErrorCode.TOO_LONG, f"{len(job.inputs)} items; the limit is {self.max_items_per_job}"
        return None

    def pack(self, jobs: Sequence[FakePrepared]) -> list[FakePrepared]:
        self.pack_threads.add(threading.current_thread().name)
        if self.fail_pack:
            raise RuntimeError("packing on fire")
        return list(jobs)

    def run_packed(self, jobs: list[FakePrepared]) -> list[Result]:
        with self._lock:
            self._active += 1
            self.max_active = max(self.max_active, self._active)
        try:
            self.threads.add(threading.current_thread().name)
            self.calls.append([j.job_id for j in jobs])
            if self.compute_s:
                time.sleep(self.compute_s)
            if self.fail:
                raise RuntimeError("device on fire")
            return self._bisected(jobs)
        finally:
            with self._lock:
                self._active -= 1

    def stats(self) -> EngineStats:
        return self.counters

    def _bisected(self, jobs: list[FakePrepared]) -> list[Result]:
        """The engine's bisection (engine/run/bisection.py), without its out-of-memory handling."""
        try:
            return self._forward(jobs)
        except Exception as exc:  # as the engine's guard: a failed forward is isolated to its job
            if is_fatal(exc):
                raise
            if len(jobs) > 1:
                half = len(jobs) // 2
                return self._bisected(jobs[:half]) + self._bisected(jobs[half:])
            return [self.served.stamp(r) for r in failed_results([jobs[0].job_id], exc, self.served.name)]

    def _forward(self, jobs: list[FakePrepared]) -> list[Result]:
        if self.fault is not None:
            self.fault([token for job in jobs for token in job.tokens])
        return [
            self.served.stamp(Result(id=j.job_id, scores=[[1.0]] * j.rows, prompt_tokens=j.num_tokens))
            for j in jobs
        ]


def _ids(text_or_ids: object) -> list[int]:
    """Token ids as sent; a text has none the fake can see."""
    return list(text_or_ids) if isinstance(text_or_ids, list) else []


class FakeProducer:
    """`ResultProducer` as delivery uses it: acknowledges every record except those to `refused` topics,
    which it refuses like the real one does after its bounded tries."""

    max_request_size = 1 << 20

    def __init__(self, refused: dict[str, BaseException] | None = None, transactional: bool = False) -> None:
        self.refused = refused or {}
        self.transactional = transactional
        self.aborted = 0  # transactions aborted at the membership check before their commit
        self.sent: list[OutRecord] = []
        self.transactions: list[dict[TopicPartition, int]] = []

    def fits(self, record: OutRecord) -> bool:
        return True

    async def ensure_topic(self, topic: str) -> None:
        if topic in self.refused:
            raise Refused(topic, self.refused[topic])

    async def send(self, record: OutRecord) -> None:
        await asyncio.sleep(0)
        await self.ensure_topic(record.topic)
        self.sent.append(record)

    async def send_transaction(self, records, offsets, group_id, still_ours=lambda: True) -> None:
        from kafka_scorer.kafka.producer import StaleTransaction

        for record in records:
            await self.send(record)
        if not still_ours():  # asked right before the commit, as the real producer does
            self.aborted += 1
            raise StaleTransaction("membership gone")
        self.transactions.append(dict(offsets))


class FakeConsumer:
    """`JobConsumer` as the ledger, delivery and rebalance use it: pauses, commits (recorded), and the
    guards (`committable`: everything, unless `membership_lost`)."""

    def __init__(self, partitions: Iterable[TopicPartition] = (TP,)) -> None:
        self.partitions = set(partitions)
        self.paused_set: set[TopicPartition] = set()
        self.membership_lost = False
        self.generation = 1  # a new value is a new membership (kafka/fenced_commit.py Membership)
        self.commits: list[dict[TopicPartition, int]] = []
        self.rewound: list[set[TopicPartition]] = []
        self.sought: list[dict[TopicPartition, int]] = []

    def assignment(self) -> set[TopicPartition]:
        return set(self.partitions)

    def pause(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        self.paused_set |= self.partitions if partitions is None else set(partitions)

    def resume(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        self.paused_set -= self.partitions if partitions is None else set(partitions)

    def paused(self) -> set[TopicPartition]:
        return set(self.paused_set)

    def committable(self, offsets: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        return {} if self.membership_lost else dict(offsets)

    def membership(self) -> object:
        return None if self.membership_lost else ("member", self.generation)

    async def seek_when_visible(self, floors: dict[TopicPartition, int], timeout_s: float) -> dict:
        self.sought.append(dict(floors))
        return dict(floors)

    async def commit(self, offsets: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        mine = self.committable(offsets)
        if mine:
            self.commits.append(mine)
        return mine

    async def rewind(self, partitions: Iterable[TopicPartition]) -> None:
        self.rewound.append(set(partitions))


def settings(**values: object) -> Settings:
    """Settings with no environment or .env file in the way."""
    return Settings(_env_file=None, model="unused", metrics_port=0, **values)  # type: ignore[call-arg]


def open_ticket(ledger: Ledger, offset: int, tp: TopicPartition = TP, reply_topic: str = DEFAULT_REPLY_TOPIC):
    """A ticket for a record at `offset`, as intake opens it."""
    origin = Origin(tp.topic, tp.partition, offset, None, reply_topic, "json", None)
    return ledger.open(tp, origin, f"j{offset}")


def answered(ticket: Ticket, dead_letter: str | None = None) -> Ticket:
    """The ticket with a score as its answer (and a dead-letter copy to `dead_letter`, if named)."""
    dead = OutRecord(dead_letter, b"x", None, []) if dead_letter else None
    return ticket.answer(Result(id=ticket.job_id, scores=[[0.5]], model="m"), dead)


@pytest.fixture
def consumer() -> FakeConsumer:
    return FakeConsumer()


@pytest.fixture
def ledger(consumer: FakeConsumer) -> Ledger:
    ledger = Ledger(settings(), WorkerMetrics(), consumer)
    ledger.tracker.assign([TP])
    return ledger


async def until(condition, timeout_s: float = 5.0) -> None:
    """Wait for `condition()` on the event loop (the worker's parts settle on tasks and callbacks)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)
