"""Token-budget micro-batching: FIFO jobs, greedily packed up to `max_batch_tokens` per forward.

Timing (how long to wait for a batch to fill) belongs to the caller: the worker's event loop knows
when records arrive; this class only decides what goes together.
"""

from __future__ import annotations

from collections import deque

from kafka_scorer.engine.inputs import PreparedJob


class TokenBudgetScheduler:
    def __init__(self, max_batch_tokens: int) -> None:
        if max_batch_tokens <= 0:
            raise ValueError("max_batch_tokens must be positive")
        self.max_batch_tokens = max_batch_tokens
        self._queue: deque[PreparedJob] = deque()
        self.queued_tokens = 0

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, job: PreparedJob) -> None:
        self._queue.append(job)
        self.queued_tokens += job.num_tokens

    @property
    def full(self) -> bool:
        """A batch could close now without waiting for more jobs."""
        return self.queued_tokens >= self.max_batch_tokens

    def next_batch(self) -> list[PreparedJob]:
        """Oldest first; a job larger than the whole budget still runs, alone, so it is never stuck."""
        batch: list[PreparedJob] = []
        tokens = 0
        while self._queue:
            job = self._queue[0]
            if batch and tokens + job.num_tokens > self.max_batch_tokens:
                break
            self._queue.popleft()
            batch.append(job)
            tokens += job.num_tokens
        self.queued_tokens -= tokens
        return batch


ForwardPlan = list[list[tuple[int, PreparedJob]]]


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
        start, tokens = 0, prefix
        for end, item in enumerate(job.items):
            if end > start and tokens + len(item) > max_batch_tokens:
                pieces.append((index, job.piece(start, end, tokens)))
                start, tokens = end, prefix
            tokens += len(item)
        pieces.append((index, job.piece(start, len(job.items), tokens)))

    groups: ForwardPlan = []
    group: list[tuple[int, PreparedJob]] = []
    tokens = 0
    for piece in pieces:
        if group and tokens + piece[1].num_tokens > max_batch_tokens:
            groups.append(group)
            group, tokens = [], 0
        group.append(piece)
        tokens += piece[1].num_tokens
    if group:
        groups.append(group)
    return groups
