"""The asyncio side of micro-batching: when a batch closes, and where the forward pass runs.

The lane queue (priority_lanes.py) decides *what* goes together; this class decides *when*: a batch
closes as soon as the queue holds `max_batch_tokens`, or when its oldest job has waited
`max_batch_wait_ms`, or at once while draining. The forward pass runs on one executor thread that owns
the device, so the event loop keeps fetching, heartbeating and producing while the model computes.

While the device still has a batch ahead, a partial batch keeps growing past `max_batch_wait_ms` until
shortly before the device is expected to need it (from the device's measured time per token): its jobs
could not start any earlier, and the jobs that join meanwhile save a forward of their own. Under a
steady load this is the difference between a stream of full batches and full ones interleaved with
scraps (measured with `kafka-scorer bench`: rerank on the CPU ran 7,680-token batches with 1,280-token
ones between them). Should the estimate be long, the device's end wakes the batch at once.

Up to two batches are out at a time: one computing and the next one already closed, packed (on a CPU
thread of its own, while the first computes) and queued behind it on the device thread, so the device
goes from one forward to the next without waiting for the event loop or for packing. A third batch
waits here, where it can keep growing until a slot frees. The batch queued behind may wait a whole
forward, so deadlines are checked again when the device takes it: a job that expired meanwhile is
handed to `on_expired` uncomputed (its batch-mates are packed again without it, on the device thread:
rare, and cheaper than a forward nobody waits for).

The batcher queues the tickets themselves (`Ticket.prepared` is what the engine packs) and writes each
ticket's queue time and answer onto it. The engine answers a failed job `internal` itself (one job that
breaks a forward is isolated there); an error that poisons the device (a `FatalError`) ends `run` with
that error: the worker stops, and the jobs of that batch stay unanswered and uncommitted.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic

from kafka_scorer.engine.failures import failed_results, is_fatal
from kafka_scorer.wire.protocol import Result
from kafka_scorer.worker.engine import B, Engine, P
from kafka_scorer.worker.priority_lanes import LaneQueue
from kafka_scorer.worker.ticket import Ticket

log = logging.getLogger(__name__)

_SLOTS = 2  # one batch computing + one ready behind it
_EWMA = 0.3  # weight of the newest batch in the device's time per token and the pack time
_LEAD_S = 0.002  # a held batch closes this long (plus twice a pack) before the device is expected free


@dataclass(frozen=True, slots=True)
class BatchDone(Generic[P]):
    """One finished forward pass: its tickets, each with its answer and queue time, plus timings."""

    tickets: list[Ticket[P]]
    compute_s: float
    tokens: int


class Batcher(Generic[P, B]):
    def __init__(
        self,
        engine: Engine[P, B],
        on_done: Callable[[BatchDone[P]], None],
        *,
        max_batch_tokens: int,
        max_batch_wait_ms: int,
        starve_ms: int | None = None,
        share: float = 0.125,
        on_expired: Callable[[list[Ticket[P]]], None] | None = None,
        queued_tokens_gauge: Any = None,
    ) -> None:
        self._engine = engine
        self._on_done = on_done
        self._on_expired = on_expired  # queued jobs whose deadline passed, taken out uncomputed
        starve_s = starve_ms / 1000 if starve_ms is not None else None  # None: arrival order (fifo)
        self._scheduler: LaneQueue[Ticket[P]] = LaneQueue(max_batch_tokens, starve_s, share)
        self._gauge = queued_tokens_gauge  # a Prometheus gauge of the queued tokens, kept current here
        self._max_wait_s = max_batch_wait_ms / 1000
        self._added = asyncio.Event()
        self._slots = asyncio.Semaphore(_SLOTS)
        self._running: set[asyncio.Future[Any]] = set()
        self._draining = False
        self.failure: BaseException | None = None  # the fatal error that stopped the batcher
        self._device = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kafka-scorer-device")
        self._s_per_token: float | None = None  # device seconds per token, from finished batches
        self._pack_s = 0.0  # recent packing time
        self._device_tokens = 0  # tokens handed to the device (packing, queued or computing)
        self._device_free_at = 0.0  # when the device is expected to run out of work (monotonic)
        self._packer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kafka-scorer-pack")

    @property
    def queued_jobs(self) -> int:
        return len(self._scheduler)

    @property
    def queued_tokens(self) -> int:
        return self._scheduler.queued_tokens

    @property
    def busy(self) -> bool:
        return bool(self._scheduler) or bool(self._running)

    def add(self, ticket: Ticket[P]) -> None:
        """Queue a prepared ticket (`ticket.prepared` set, its tokens counted by the ledger)."""
        self._scheduler.add(ticket)
        self._gauge_queue()
        self._added.set()

    def discard(self, doomed: Callable[[Ticket[P]], bool]) -> list[Ticket[P]]:
        """Take the queued tickets `doomed` picks out of the queue, uncomputed, and return them. After a
        rebalance the jobs of revoked partitions are the next owner's: computing them here would only
        delay live work (and a drain) for results that are thrown away. Jobs already packed or on the
        device finish; their late results are dropped by the delivery layer."""
        removed = self._scheduler.remove_if(doomed)
        self._gauge_queue()
        return removed

    def _gauge_queue(self) -> None:
        if self._gauge is not None:
            self._gauge.set(self._scheduler.queued_tokens)

    def drain(self, on: bool = True) -> None:
        """While draining, batches close at once instead of waiting to fill (shutdown, rebalance)."""
        self._draining = on
        self._added.set()

    async def run(self) -> None:
        """Form and launch batches until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            await self._slots.acquire()
            try:
                batch = await self._next_batch()
            except BaseException:
                self._slots.release()
                raise
            if self.failure is not None:
                raise self.failure
            self._gauge_queue()
            self._hand_to_device(sum(t.num_tokens for t in batch))
            future = asyncio.ensure_future(self._pack_and_compute(loop, batch))
            self._running.add(future)
            future.add_done_callback(functools.partial(self._finished, batch=batch))

    async def _next_batch(self) -> list[Ticket[P]]:
        """Wait until a batch should close, then close it; expired jobs leave the queue on every turn."""
        while True:
            now = time.monotonic()
            self._expire(now)
            if self.failure is not None:
                return []
            if not self._scheduler:
                self._added.clear()
                await self._added.wait()
                continue
            if self._draining or self._scheduler.full:
                return self._scheduler.next_batch(now)
            oldest_at = self._scheduler.oldest().enqueued_at
            remaining = max(self._max_wait_s - (now - oldest_at), self._device_ahead_s(now))
            if remaining <= 0:
                return self._scheduler.next_batch(now)
            expiry = self._scheduler.next_expiry()
            wait_s = remaining if expiry is None else min(remaining, max(0.0, expiry - now))
            self._added.clear()
            with contextlib.suppress(TimeoutError):  # woken by a new job, or the time is up: look again
                await asyncio.wait_for(self._added.wait(), wait_s)

    def _expire(self, now: float) -> None:
        if self._on_expired is None:
            return
        expired = self._scheduler.expire(now)
        if expired:
            self._gauge_queue()
            self._on_expired(expired)

    def _device_ahead_s(self, now: float) -> float:
        """How long a partial batch may still grow before the device needs it (<= 0: close it now)."""
        if self._s_per_token is None or not self._running:
            return 0.0
        return self._device_free_at - now - 2 * self._pack_s - _LEAD_S

    def _hand_to_device(self, tokens: int) -> None:
        self._device_tokens += tokens
        if self._s_per_token is not None:
            start = max(time.monotonic(), self._device_free_at)
            self._device_free_at = start + tokens * self._s_per_token

    def _learn(self, handed: int, computed: int, compute_s: float, pack_s: float) -> None:
        """After a forward: the device's pace, and when what is still handed to it should be done (the
        next batch starts now, as it was queued behind this one)."""
        self._device_tokens -= handed
        if computed > 0:
            pace = compute_s / computed
            old = self._s_per_token
            self._s_per_token = pace if old is None else (1 - _EWMA) * old + _EWMA * pace
        self._pack_s = (1 - _EWMA) * self._pack_s + _EWMA * pack_s
        self._device_free_at = time.monotonic() + self._device_tokens * (self._s_per_token or 0.0)
        self._added.set()  # a held batch re-reads the estimate (the device may be free already)

    async def _pack_and_compute(
        self, loop: asyncio.AbstractEventLoop, batch: list[Ticket[P]]
    ) -> tuple[list[Result | None], float, float, float]:
        """Packing runs while the device still computes the previous batch; both threads are FIFO, so
        batches reach the device in the order they closed."""
        jobs = [t.prepared for t in batch]
        # Deadlines are checked again where the forward starts (None: this batcher expires nothing)
        deadlines = [t.deadline for t in batch] if self._on_expired is not None else None
        packed, pack_s = await loop.run_in_executor(self._packer, self._pack, jobs)
        return (*await loop.run_in_executor(self._device, self._compute, packed, jobs, deadlines), pack_s)

    def _pack(self, jobs: list[Any]) -> tuple[B, float]:
        started = time.monotonic()
        packed = self._engine.pack(jobs)
        return packed, time.monotonic() - started

    def _compute(
        self, packed: B, jobs: list[Any], deadlines: list[float | None] | None
    ) -> tuple[list[Result | None], float, float]:
        """On the device thread: the engine's forwards for one packed batch. A batch waits behind the
        one computing (up to a whole forward): its jobs whose deadline passed meanwhile are left out
        (None: answered `deadline_exceeded`, uncomputed), the rest packed again here (rare)."""
        started = time.monotonic()
        late = [d is not None and d <= started for d in deadlines or ()]
        if not any(late):
            computed: list[Result | None] = [*self._checked(self._engine.run_packed(packed), len(jobs))]
            return computed, started, time.monotonic() - started
        live = [job for job, gone in zip(jobs, late, strict=True) if not gone]
        scored = iter(
            self._checked(self._engine.run_packed(self._engine.pack(live)), len(live)) if live else []
        )
        results = [None if gone else next(scored) for gone in late]
        return results, started, time.monotonic() - started

    @staticmethod
    def _checked(results: list[Result], count: int) -> list[Result]:
        if len(results) != count:
            raise RuntimeError(f"run_packed returned {len(results)} results for {count} jobs")
        return results

    def _finished(self, future: asyncio.Future[Any], batch: list[Ticket[P]]) -> None:
        self._running.discard(future)
        self._slots.release()
        if future.cancelled():
            return
        tokens = sum(t.num_tokens for t in batch)
        exc = future.exception()
        if exc is not None and is_fatal(exc):  # the device is poisoned: nothing more is computed
            log.critical("device error, the worker can no longer score: %r", exc)
            self.failure = self.failure or exc
            self._added.set()  # wake `run`, which raises it
            return
        if exc is not None:
            # Catch-all, on purpose: the engine answers every failed job itself, so what arrives here is
            # a bug in packing or in the engine's own failure handling; the batch is still answered.
            log.error("batch of %d jobs failed", len(batch), exc_info=exc)
            self._device_tokens -= tokens
            results, started, compute_s = failed_results([t.job_id for t in batch], exc), 0.0, 0.0
        else:
            results, started, compute_s, pack_s = future.result()
            batch, results = self._late_out(batch, results)
            computed = sum(t.num_tokens for t in batch)
            self._learn(tokens, computed, compute_s, pack_s)
            tokens = computed
        for ticket, result in zip(batch, results, strict=True):
            ticket.queue_s = max(0.0, started - ticket.enqueued_at) if started else 0.0
            ticket.answer(result)
        if batch:
            self._on_done(BatchDone(batch, compute_s, tokens))

    def _late_out(
        self, batch: list[Ticket[P]], results: list[Result | None]
    ) -> tuple[list[Ticket[P]], list[Result]]:
        """The computed tickets and their results; those whose deadline passed before the device took
        the batch (no result) go to `on_expired`."""
        late = [t for t, r in zip(batch, results, strict=True) if r is None]
        if late and self._on_expired is not None:  # only then are deadlines checked on the device
            self._on_expired(late)
        pairs = [(t, r) for t, r in zip(batch, results, strict=True) if r is not None]
        return [t for t, _ in pairs], [r for _, r in pairs]

    async def idle(self) -> None:
        """Wait until nothing is queued or computing."""
        while self.busy:
            if self._running:
                await asyncio.wait(list(self._running))
            else:
                await asyncio.sleep(0.005)

    def close(self) -> None:
        self._packer.shutdown(wait=False, cancel_futures=True)
        self._device.shutdown(wait=False, cancel_futures=True)
