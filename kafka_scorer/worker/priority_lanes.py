"""What goes into the next batch: priority lanes, earliest deadline first, a reserved share for jobs
that have waited long; or plain arrival order.

The budget rule is the one the engine's scheduler and planner follow (engine/pack/budget.py): a batch takes
jobs in order while they fit `max_batch_tokens`, and a job larger than the whole budget still runs, alone.
Only the order differs:

- `priority` (the default): highest priority first, earliest deadline first within one (a job without
  a deadline last), then arrival. Starvation is bounded by a share, not by aging priorities: a job
  below the highest queued priority that has waited `starve_s` is *starving*. Every batch reserves
  `share` of its token budget for the starving jobs: they go first, oldest first, as far as the
  reservation covers them, and the rest fills by priority. A starving job larger than one reservation
  saves up: the reservations of the batches that pass it over add up (a credit) until they cover it,
  and then it goes first. Should the starving jobs that went first keep a higher-priority job out of a
  batch it would have fitted alone (two jobs over half the budget each), the next batch is priority's:
  no starving jobs first. So while higher-priority jobs keep coming, lower ones still get about `share`
  of the tokens computed, and a fresh higher-priority job waits behind the starving jobs of at most one
  batch: `share` of its budget, or one larger job that saved up for it. (Aging priorities up instead
  would, after a while, put a whole queued backlog ahead of every new interactive job: measured with
  `bench --workload backlog`, interactive p50 12.6 s. Taking at least one starving job in every batch,
  as this queue once did, put every job over half the budget behind the whole starving backlog.)
- `fifo`: arrival order (starve_s None).

Sorting is stable and recomputed when a batch closes (the queue holds what backpressure lets in: a few
thousand jobs at most), so waits are always current and ties keep arrival order.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from kafka_scorer.engine.pack.budget import BudgetFill, num_tokens


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
        self._credit = 0.0  # the starving share's saved-up reservations, in tokens
        self._yield = False  # the next batch is priority's: the last one's starving jobs kept one out

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
        """The next batch: the starving share first (unless it is priority's turn), then lane order; the
        rest stay in arrival order."""
        picked = BudgetFill[T](self.max_batch_tokens, num_tokens)
        starving = self._starving(now)
        if starving:
            self._starving_turn(picked, starving)
        else:
            self._credit, self._yield = 0.0, False
        share = list(picked.jobs)
        first = {id(job) for job in share}
        blocked = picked.take(job for job in self._ordered() if id(job) not in first)
        self._yield = _kept_out(picked, share, blocked)
        taken = {id(job) for job in picked.jobs}
        self._queue = [job for job in self._queue if id(job) not in taken]
        self.queued_tokens -= picked.tokens
        return picked.jobs

    def _starving_turn(self, picked: BudgetFill[T], starving: list[T]) -> None:
        """The batch's reservation joins the credit (no more than the oldest starving job needs), and
        the starving jobs it covers go first, unless the last batch's kept a higher-priority job out."""
        reserve = self.share * self.max_batch_tokens
        self._credit = min(self._credit + reserve, max(reserve, starving[0].num_tokens))
        if self._yield:
            self._yield = False
            return
        self._credit -= _take_within(picked, starving, self._credit)

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


def _kept_out(picked: BudgetFill[T], share: list[T], blocked: T | None) -> bool:
    """Did the starving jobs that went first (`share`) keep `blocked`, of a higher priority than all of
    them, out of a batch it would have fitted without them?"""
    if not share or blocked is None or blocked.priority <= max(job.priority for job in share):
        return False
    others = picked.tokens - sum(job.num_tokens for job in share)
    return others == 0 or others + blocked.num_tokens <= picked.budget


def _take_within(picked: BudgetFill[T], jobs: list[T], credit: float) -> int:
    """Take `jobs` in order while each fits the batch and the tokens taken stay within `credit` (a strict
    limit: unlike the batch's budget, the credit takes no oversize job): their tokens."""
    spent = 0
    for job in jobs:
        if spent + job.num_tokens > credit or not picked.fits(job):
            break
        picked.add(job)
        spent += job.num_tokens
    return spent
