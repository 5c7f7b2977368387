"""Jobs scored end to end outside the worker: prepared, batched by the token budget, run.

The in-process client's `score_jobs` and the warm-up's batches both score this way; the worker batches
its own jobs (its lanes and batcher) and calls the seam's steps instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kafka_scorer.engine.pack.scheduler import TokenBudgetScheduler
from kafka_scorer.engine.prepare.prepared import PreparedJob
from kafka_scorer.wire.protocol import Job, Result


def score_in_batches(
    jobs: Sequence[Job],
    prepare: Callable[[Job, str], PreparedJob | Result],
    run_batch: Callable[[list[PreparedJob]], list[Result]],
    max_batch_tokens: int,
) -> list[Result]:
    """Results in the jobs' order; a job without an id is known by its position."""
    results: list[Result | None] = [None] * len(jobs)
    scheduler: TokenBudgetScheduler[PreparedJob] = TokenBudgetScheduler(max_batch_tokens)
    position: dict[int, int] = {}
    for index, job in enumerate(jobs):
        prepared = prepare(job, job.id if job.id is not None else str(index))
        if isinstance(prepared, Result):
            results[index] = prepared
        else:
            position[id(prepared)] = index
            scheduler.add(prepared)
    while batch := scheduler.next_batch():
        for prepared, result in zip(batch, run_batch(batch)):
            results[position[id(prepared)]] = result
    return [result for result in results if result is not None]
