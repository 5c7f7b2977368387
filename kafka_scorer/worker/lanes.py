"""What goes into the next batch: priority lanes, earliest deadline first, a reserved share for jobs
that have waited long; or plain arrival order.

The budget rule is the engine scheduler's (engine/scheduler.py): a batch takes jobs in order while they
fit `max_batch_tokens`, and a job larger than the whole budget still runs, alone. Only the order differs:

- `priority` (the default): highest priority first, earliest deadline first within one (a job without
  a deadline last), then arrival. Starvation is bounded by a share, not by aging priorities: a job
  below the highest queued priority that has waited `starve_s` is *starving*, and every batch first
  takes the starving jobs, oldest first, up to `share` of its token budget (at least one job), then
  fills the rest by priority. So while higher-priority jobs keep coming, lower ones still get that
  share of every forward, and a fresh higher-priority job is never queued behind more than that share
  of old work. (Aging priorities up instead would, after a while, put a whole queued backlog ahead of
  every new interactive job: measured with `bench --workload backlog`, interactive p50 12.6 s.)
- `fifo`: arrival order (starve_s None).

Sorting is stable and recomputed when a batch closes (the queue holds what backpressure lets in: a few
thousand jobs at most), so waits are always current and ties keep arrival order.
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
    def __init__(self, max_batch_tokens: int, starve_s: float | None, share: float = 0.125) -> None:
        if max_batch_tokens <= 0:
            raise ValueError("max_batch_tokens must be positive")
        self.max_batch_tokens = max_batch_tokens
        self.starve_s = starve_s
        self.share = share
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
        """The next batch: the starving share first, then lane order; the rest stay in arrival order."""
        batch: list[T] = []
        taken: set[int] = set()
        tokens = 0

        def take(jobs: list[T], limit: int) -> None:
            nonlocal tokens
            for job in jobs:
                if id(job) in taken:
                    continue
                if batch and tokens + job.num_tokens > limit:
                    return
                batch.append(job)
                taken.add(id(job))
                tokens += job.num_tokens

        take(self._starving(now), int(self.max_batch_tokens * self.share))
        take(self._ordered(), self.max_batch_tokens)
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

    def _starving(self, now: float) -> list[T]:
        """Jobs below the highest queued priority that have waited `starve_s`, oldest first."""
        if self.starve_s is None or not self._queue:
            return []
        top = max(job.priority for job in self._queue)
        return [j for j in self._queue if j.priority < top and now - j.enqueued_at >= self.starve_s]

    def _ordered(self) -> list[T]:
        if self.starve_s is None:
            return self._queue
        return sorted(self._queue, key=lambda job: (-job.priority, _never(job.deadline)))


def _never(deadline: float | None) -> float:
    return deadline if deadline is not None else math.inf
