"""When batches close and where they run: the batcher against a stand-in engine that records calls.

The stand-in only stands for the model (scores are not under test here); what is checked is the
batching contract of issue 3: close at the token budget or after max_batch_wait_ms, at once when
draining, forward passes on one thread off the event loop, every job answered even if the engine raises.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from aiokafka import TopicPartition

from kafka_scorer.kafka.offsets import Watermark
from kafka_scorer.wire.protocol import ErrorCode, Result
from kafka_scorer.worker.batcher import BatchDone, Batcher
from kafka_scorer.worker.envelope import Origin
from kafka_scorer.worker.ticket import Ticket
from tests.worker.conftest import FakeEngine, FakePrepared

RecordingEngine = FakeEngine
TP = TopicPartition("jobs", 0)


def job(name: str, tokens: int, partition: int = 0, deadline: float | None = None) -> Ticket:
    """A ticket as intake queues it: prepared, its tokens counted, enqueued now."""
    origin = Origin("jobs", partition, 0, None, "results", "json", None)
    ticket = Ticket(TopicPartition("jobs", partition), origin, name, Watermark(), time.monotonic(), None)
    ticket.prepared = FakePrepared(name, tokens)
    ticket.tokens = tokens
    ticket.enqueued_at = time.monotonic()
    ticket.deadline = deadline
    return ticket


def results(done: BatchDone) -> list[Result]:
    return [t.result for t in done.tickets]


@pytest.fixture
def done() -> list[BatchDone]:
    return []


async def _run(batcher: Batcher, until, timeout_s: float = 5.0) -> None:
    task = asyncio.create_task(batcher.run())
    try:
        deadline = time.monotonic() + timeout_s
        while not until():
            assert time.monotonic() < deadline, "batcher did not deliver in time"
            await asyncio.sleep(0.005)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        batcher.close()


async def test_batch_closes_at_the_token_budget_without_waiting(done) -> None:
    engine = RecordingEngine()
    batcher = Batcher(engine, done.append, max_batch_tokens=30, max_batch_wait_ms=60_000)
    for i in range(7):
        batcher.add(job(f"j{i}", 10))
    await _run(batcher, lambda: sum(len(d.tickets) for d in done) >= 6)
    assert engine.calls[:2] == [["j0", "j1", "j2"], ["j3", "j4", "j5"]]
    assert [t.job_id for t in done[0].tickets] == ["j0", "j1", "j2"]  # tickets come back answered, in order
    assert [r.id for r in results(done[0])] == ["j0", "j1", "j2"]
    assert done[0].tokens == 30
    assert batcher.queued_jobs == 1  # j6 alone is under budget: it waits for more jobs or the timer


async def test_a_partial_batch_closes_after_max_batch_wait(done) -> None:
    engine = RecordingEngine()
    batcher = Batcher(engine, done.append, max_batch_tokens=1000, max_batch_wait_ms=80)
    batcher.add(job("lonely", 5))
    await _run(batcher, lambda: bool(done))
    assert engine.calls == [["lonely"]]
    assert done[0].tickets[0].queue_s >= 0.08  # it did wait for company first


async def test_draining_closes_batches_at_once(done) -> None:
    engine = RecordingEngine()
    batcher = Batcher(engine, done.append, max_batch_tokens=1000, max_batch_wait_ms=60_000)
    batcher.add(job("a", 5))
    batcher.drain()
    await _run(batcher, lambda: bool(done), timeout_s=5)
    assert engine.calls == [["a"]]


async def test_forward_passes_run_on_one_thread_off_the_event_loop(done) -> None:
    engine = RecordingEngine(compute_s=0.2)
    batcher = Batcher(engine, done.append, max_batch_tokens=10, max_batch_wait_ms=0)
    for i in range(4):
        batcher.add(job(f"j{i}", 10))
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    tick_task = asyncio.create_task(ticker())
    await _run(batcher, lambda: len(done) == 4)
    tick_task.cancel()
    assert ticks >= 20, "the event loop must keep running while the model computes"
    assert len(engine.threads) == 1 and threading.current_thread().name not in engine.threads
    assert engine.max_active == 1, "one thread owns the device: never two forward passes at once"
    assert engine.pack_threads.isdisjoint(engine.threads | {threading.current_thread().name})


class OverlapProbe(RecordingEngine):
    """The first forward blocks until the second batch has been packed: if packing waited for the
    device thread (or ran on it), the second pack could never happen while the first forward runs."""

    def __init__(self) -> None:
        super().__init__()
        self.second_packed = threading.Event()
        self.packs = 0
        self.overlapped = False

    def pack(self, jobs):
        self.packs += 1
        if self.packs == 2:
            self.second_packed.set()
        return super().pack(jobs)

    def run_packed(self, jobs):
        if not self.calls:
            self.overlapped = self.second_packed.wait(timeout=3)
        return super().run_packed(jobs)


async def test_the_next_batch_is_packed_while_the_device_computes(done) -> None:
    engine = OverlapProbe()
    batcher = Batcher(engine, done.append, max_batch_tokens=10, max_batch_wait_ms=0)
    for i in range(2):
        batcher.add(job(f"j{i}", 10))
    await _run(batcher, lambda: len(done) == 2, timeout_s=10)
    assert engine.overlapped, "batch 2 was not packed while batch 1 was on the device"
    assert engine.calls == [["j0"], ["j1"]], "batches reach the device in the order they closed"


async def test_an_engine_that_raises_still_answers_every_job(done) -> None:
    engine = RecordingEngine(fail=True)
    batcher = Batcher(engine, done.append, max_batch_tokens=100, max_batch_wait_ms=0)
    batcher.add(job("x", 5))
    batcher.add(job("y", 5))
    await _run(batcher, lambda: sum(len(d.tickets) for d in done) == 2)
    answers = [r for d in done for r in results(d)]
    assert {r.id for r in answers} == {"x", "y"}
    assert all(r.error is not None and r.error.code is ErrorCode.INTERNAL for r in answers)
    assert "device on fire" in answers[0].error.message


async def test_a_packing_failure_still_answers_every_job(done) -> None:
    engine = RecordingEngine(fail_pack=True)
    batcher = Batcher(engine, done.append, max_batch_tokens=100, max_batch_wait_ms=0)
    batcher.add(job("x", 5))
    await _run(batcher, lambda: bool(done))
    (result,) = results(done[0])
    assert result.error is not None and result.error.code is ErrorCode.INTERNAL
    assert "packing on fire" in result.error.message
    assert engine.calls == [], "nothing reaches the device for a batch that could not be packed"


class PoisonedDevice(RecordingEngine):
    def run_packed(self, jobs):
        self.calls.append([j.job_id for j in jobs])
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


async def test_a_device_error_that_poisons_the_process_stops_the_batcher_unanswered(done) -> None:
    engine = PoisonedDevice()
    batcher = Batcher(engine, done.append, max_batch_tokens=5, max_batch_wait_ms=0)
    for name in ("x", "y", "z"):
        batcher.add(job(name, 5))
    task = asyncio.create_task(batcher.run())
    try:
        with pytest.raises(RuntimeError, match="illegal memory access"):
            await asyncio.wait_for(task, 5)
    finally:
        batcher.close()
    assert batcher.failure is not None
    assert done == [], "no job of a poisoned device may be answered (its offset must stay uncommitted)"
    assert len(engine.calls) <= 2, "no batch may start on the device after the fault is known"


async def test_discarded_jobs_are_never_computed_and_the_rest_keep_their_order(done) -> None:
    """After a rebalance the queued jobs of revoked partitions leave the queue uncomputed; the others
    run in their original order and the token count drops by exactly the discarded jobs'."""
    engine = RecordingEngine()
    batcher = Batcher(engine, done.append, max_batch_tokens=1000, max_batch_wait_ms=60_000)
    for i in range(8):
        batcher.add(job(f"j{i}", 10 + i, partition=i % 2))
    dropped = batcher.discard(lambda ticket: ticket.tp.partition == 1)
    assert [t.job_id for t in dropped] == ["j1", "j3", "j5", "j7"]
    assert batcher.queued_jobs == 4 and batcher.queued_tokens == 10 + 12 + 14 + 16
    batcher.drain()
    await _run(batcher, lambda: bool(done))
    assert engine.calls == [["j0", "j2", "j4", "j6"]]
    assert batcher.discard(lambda ticket: True) == []


class TimedEngine(RecordingEngine):
    """Records when each forward started and ended (monotonic), to see the device's idle gaps."""

    def __init__(self, compute_s: float) -> None:
        super().__init__(compute_s=compute_s)
        self.spans: list[tuple[float, float]] = []

    def run_packed(self, jobs):
        started = time.monotonic()
        try:
            return super().run_packed(jobs)
        finally:
            self.spans.append((started, time.monotonic()))


async def test_a_partial_batch_grows_while_the_device_has_a_batch_ahead(done) -> None:
    """j6 is left over under the budget and has waited past max_batch_wait_ms when a slot frees, but the
    device still has [j3..j5] to compute: closing j6 alone then would only put a scrap batch on the
    device. It keeps growing, and the jobs that arrive meanwhile ride in the same forward."""
    engine = TimedEngine(compute_s=0.5)
    batcher = Batcher(engine, done.append, max_batch_tokens=30, max_batch_wait_ms=10)
    for i in range(7):
        batcher.add(job(f"j{i}", 10))

    async def more_after_the_first_batch() -> None:
        while not done:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)  # well inside the second batch's 0.5 s
        batcher.add(job("j7", 10))
        batcher.add(job("j8", 10))

    adder = asyncio.create_task(more_after_the_first_batch())
    await _run(batcher, lambda: len(done) >= 3)
    await adder
    assert engine.calls == [["j0", "j1", "j2"], ["j3", "j4", "j5"], ["j6", "j7", "j8"]]


async def test_a_held_batch_still_reaches_the_device_when_it_frees(done) -> None:
    """Held back, the lone leftover must not make the device wait: it runs right after the batch ahead
    (the bound is generous against 0.5 s forwards, for a loaded machine)."""
    engine = TimedEngine(compute_s=0.5)
    batcher = Batcher(engine, done.append, max_batch_tokens=30, max_batch_wait_ms=10)
    for i in range(7):
        batcher.add(job(f"j{i}", 10))
    await _run(batcher, lambda: len(done) >= 3)
    assert engine.calls == [["j0", "j1", "j2"], ["j3", "j4", "j5"], ["j6"]]
    (_, second_end), (third_start, _) = engine.spans[1], engine.spans[2]
    assert third_start - second_end < 0.25


def test_the_worker_imports_no_torch() -> None:
    """The worker side only counts tokens: importing it must not load torch (seconds of start-up, and
    the seam between worker and engine stays honest)."""
    import subprocess
    import sys

    code = "import sys, kafka_scorer.worker.service; print('torch' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "False"


async def test_a_queued_job_whose_deadline_passes_leaves_uncomputed(done) -> None:
    """The batch would wait a minute to fill; the job's deadline passes first, so it is handed back
    (to be answered deadline_exceeded) at its deadline, and the device never sees it."""
    engine = RecordingEngine()
    expired: list[Ticket] = []
    batcher = Batcher(
        engine, done.append, max_batch_tokens=1000, max_batch_wait_ms=60_000, on_expired=expired.extend
    )
    batcher.add(job("doomed", 10, deadline=time.monotonic() + 0.1))
    await _run(batcher, lambda: bool(expired))
    assert [t.job_id for t in expired] == ["doomed"]
    assert engine.calls == [] and done == [] and batcher.queued_tokens == 0


async def test_a_job_whose_deadline_passes_while_its_batch_waits_for_the_device_is_not_computed(done) -> None:
    """Issue 26: the batch closed in time but waits behind a whole forward (two batches are out at once);
    the device takes it after the deadline, so that job is left out, uncomputed, and its batch-mate
    still runs (message-schema.md: expired "before its forward pass starts")."""
    engine = RecordingEngine(compute_s=0.4)
    expired: list[Ticket] = []
    batcher = Batcher(
        engine, done.append, max_batch_tokens=20, max_batch_wait_ms=0, on_expired=expired.extend
    )
    batcher.add(job("first", 20))
    batcher.add(job("doomed", 10, deadline=time.monotonic() + 0.15))
    batcher.add(job("mate", 10, deadline=time.monotonic() + 60))
    await _run(batcher, lambda: sum(len(d.tickets) for d in done) == 2 and bool(expired))
    assert engine.calls == [["first"], ["mate"]], "the late job never reached a forward"
    assert [t.job_id for t in expired] == ["doomed"] and expired[0].result is None
    assert [[t.job_id for t in d.tickets] for d in done] == [["first"], ["mate"]]
    assert done[1].tokens == 10 and results(done[1])[0].id == "mate"
