"""What goes into the next batch: priority lanes, earliest deadline first, aging; or plain arrival order.

The budget rule is the engine scheduler's (engine/scheduler.py): a batch takes jobs in order while they
fit `max_batch_tokens`, and a job larger than the whole budget still runs, alone. Only the order differs:

- `priority` (the default): highest effective priority first, earliest deadline first within one (a
  job without a deadline last), then arrival. A queued job's effective priority is its priority plus one
  for every `aging_s` it has waited here, so while newer jobs of a priority `d` higher keep arriving, a
  job waits behind them for at most `(d + 1) * aging_s` (plus the forwards already ahead of it).
- `fifo`: arrival order (aging_s None).

Sorting is stable and recomputed when a batch closes (the queue holds what backpressure lets in: a few
thousand jobs at most), so effective priorities are always current and ties keep arrival order.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar


class Queued(Protocol):
    @property
    def num_tokens(self) -> int: ...

    priority: int
    deadline: float | None
    enqueued_at: float


T = TypeVar("T", bound=Queued)


class LaneQueue(Generic[T]):
    def __init__(self, max_batch_tokens: int, aging_s: float | None) -> None:
        if max_batch_tokens <= 0:
            raise ValueError("max_batch_tokens must be positive")
        self.max_batch_tokens = max_batch_tokens
        self.aging_s = aging_s
        self._queue: list[T] = []  # arrival order
        self.queued_tokens = 0

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, job: T) -> None:
        self._queue.append(job)
        self.queued_tokens += job.num_tokens

    @property
    def full(self) -> bool:
        """A batch could close now without waiting for more jobs."""
        return self.queued_tokens >= self.max_batch_tokens

    def oldest(self) -> T:
        """The job queued first (the queue must not be empty): its wait decides when a batch closes."""
        return self._queue[0]

    def next_batch(self, now: float) -> list[T]:
        """The next batch in lane order; the rest stay queued in arrival order."""
        batch: list[T] = []
        tokens = 0
        for job in self._ordered(now):
            if batch and tokens + job.num_tokens > self.max_batch_tokens:
                break
            batch.append(job)
            tokens += job.num_tokens
        taken = {id(job) for job in batch}
        self._queue = [job for job in self._queue if id(job) not in taken]
        self.queued_tokens -= tokens
        return batch

    def remove_if(self, doomed: Callable[[T], bool]) -> list[T]:
        """Take out the jobs `doomed` picks, keeping the order of the rest; returned for settling."""
        kept: list[T] = []
        removed: list[T] = []
        for job in self._queue:
            (removed if doomed(job) else kept).append(job)
        self._queue = kept
        self.queued_tokens -= sum(job.num_tokens for job in removed)
        return removed

    def expire(self, now: float) -> list[T]:
        """Take out the jobs whose deadline has passed."""
        return self.remove_if(lambda job: job.deadline is not None and job.deadline <= now)

    def next_expiry(self) -> float | None:
        """The earliest deadline queued, if any."""
        return min((job.deadline for job in self._queue if job.deadline is not None), default=None)

    def _ordered(self, now: float) -> list[T]:
        if self.aging_s is None:
            return self._queue
        aging_s = self.aging_s

        def key(job: T) -> tuple[int, float]:
            effective = job.priority + int((now - job.enqueued_at) / aging_s)
            return (-effective, job.deadline if job.deadline is not None else math.inf)

        return sorted(self._queue, key=key)
