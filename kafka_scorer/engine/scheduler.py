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
