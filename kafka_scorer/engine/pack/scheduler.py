"""Token-budget micro-batching: FIFO jobs, greedily packed up to `max_batch_tokens` per forward.

Timing (how long to wait for a batch to fill) belongs to the caller: the worker's event loop knows
when records arrive; this class only decides what goes together, by the budget rule of `budget.py`.
It needs nothing of a job but its token count, so it is generic and imports no torch (`plan_forwards`
below is the engine's own, and sees `PreparedJob`s).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

from kafka_scorer.engine.pack.budget import BudgetFill, Counted, fill_batches, num_tokens

if TYPE_CHECKING:
    from kafka_scorer.engine.prepare.prepared import PreparedJob


J = TypeVar("J", bound=Counted)


class TokenBudgetScheduler(Generic[J]):
    def __init__(self, max_batch_tokens: int) -> None:
        if max_batch_tokens <= 0:
            raise ValueError("max_batch_tokens must be positive")
        self.max_batch_tokens = max_batch_tokens
        self._queue: deque[J] = deque()
        self.queued_tokens = 0

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, job: J) -> None:
        self._queue.append(job)
        self.queued_tokens += job.num_tokens

    @property
    def full(self) -> bool:
        """A batch could close now without waiting for more jobs."""
        return self.queued_tokens >= self.max_batch_tokens

    def next_batch(self) -> list[J]:
        """Oldest first; a job larger than the whole budget still runs, alone, so it is never stuck."""
        fill = BudgetFill[J](self.max_batch_tokens, num_tokens)
        fill.take(self._queue)
        for _ in fill.jobs:
            self._queue.popleft()
        self.queued_tokens -= fill.tokens
        return fill.jobs

    def remove_if(self, doomed: Callable[[J], bool]) -> list[J]:
        """Take out the queued jobs `doomed` picks (work of a partition that was revoked), keeping the
        order of the rest; they are returned so the caller can settle them."""
        kept: deque[J] = deque()
        removed: list[J] = []
        for job in self._queue:
            (removed if doomed(job) else kept).append(job)
        self._queue = kept
        self.queued_tokens -= sum(job.num_tokens for job in removed)
        return removed


ForwardPlan = list[list[tuple[int, "PreparedJob"]]]


def plan_forwards(jobs: list[PreparedJob], max_batch_tokens: int) -> ForwardPlan:
    """Split a batch into forward passes that each stay within the token budget.

    A job can be far larger than the budget (200 pairs of 528 tokens is 13 budgets; a packed query with
    2,000 items is several); one giant forward is slower per token and peaks memory past what the
    budget was sized for. Such a job is cut between items into pieces (the same `PreparedJob` with a
    slice of its items): pairs are simply split; a packed MIS sequence becomes several packed sequences,
    each repeating the query (it costs the query once more per piece, and every item still sees exactly
    the query and itself). Returns groups of (index of the job in `jobs`, piece), pieces of a job in
    item order.
    """
    pieces: list[tuple[int, PreparedJob]] = []
    for index, job in enumerate(jobs):
        if job.num_tokens <= max_batch_tokens or len(job.items) < 2:
            pieces.append((index, job))
            continue
        prefix = len(job.query) if job.packed else 0
        start = 0  # every piece repeats the prefix: its items share what the prefix leaves of the budget
        for items in fill_batches(job.items, max_batch_tokens - prefix, len):
            end = start + len(items)
            pieces.append((index, job.piece(start, end, prefix + sum(map(len, items)))))
            start = end
    return fill_batches(pieces, max_batch_tokens, _piece_tokens)


def _piece_tokens(piece: tuple[int, PreparedJob]) -> int:
    return piece[1].num_tokens
