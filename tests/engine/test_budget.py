"""The token budget's one rule (engine/pack/budget.py), checked on generated job sizes against its
definition, and the worker's lanes and the engine's scheduler shown to batch by it."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from kafka_scorer.engine.pack.budget import BudgetFill, fill_batches, num_tokens
from kafka_scorer.engine.pack.scheduler import TokenBudgetScheduler
from kafka_scorer.worker.priority_lanes import LaneQueue


@dataclass(eq=False)  # compared by identity: a job taken twice is two references to one object
class Job:
    num_tokens: int
    priority: int = 0
    deadline: float | None = None
    enqueued_at: float = 0.0


sizes = st.lists(st.integers(min_value=0, max_value=300), max_size=40)
budgets = st.integers(min_value=1, max_value=200)


def jobs_of(tokens: list[int]) -> list[Job]:
    return [Job(n) for n in tokens]


def total(batch: list[Job]) -> int:
    return sum(job.num_tokens for job in batch)


@given(sizes, budgets)
def test_batches_keep_every_job_once_in_order_and_each_fits_unless_it_is_one_oversize_job(
    tokens: list[int], budget: int
) -> None:
    jobs = jobs_of(tokens)
    batches = fill_batches(jobs, budget, num_tokens)
    flat = [job for batch in batches for job in batch]
    assert len(flat) == len(jobs) and all(a is b for a, b in zip(flat, jobs, strict=True))
    for batch in batches:
        assert batch, "no empty batch"
        assert total(batch) <= budget or len(batch) == 1
    for batch, after in pairwise(batches):
        assert total(batch) + after[0].num_tokens > budget, "a batch closed though the next job fitted"


@given(sizes, budgets)
def test_take_stops_at_the_first_job_that_does_not_fit_and_returns_it(tokens: list[int], budget: int) -> None:
    jobs = jobs_of(tokens)
    fill = BudgetFill[Job](budget, num_tokens)
    blocked = fill.take(jobs)
    taken = len(fill.jobs)
    assert all(a is b for a, b in zip(fill.jobs, jobs[:taken], strict=True))
    assert fill.tokens == total(fill.jobs)
    assert fill.tokens <= budget or taken == 1
    if blocked is None:
        assert taken == len(jobs)
    else:
        assert blocked is jobs[taken] and fill.tokens + blocked.num_tokens > budget


def test_a_job_that_fills_the_budget_exactly_fits() -> None:
    assert [[j.num_tokens for j in b] for b in fill_batches(jobs_of([60, 40, 1]), 100, num_tokens)] == [
        [60, 40],
        [1],
    ]


def test_a_job_over_the_budget_runs_alone_wherever_it_stands() -> None:
    got = fill_batches(jobs_of([10, 500, 10, 10]), 50, num_tokens)
    assert [[j.num_tokens for j in b] for b in got] == [[10], [500], [10, 10]]


@given(sizes, budgets)
def test_the_scheduler_and_the_fifo_lanes_batch_by_the_rule(tokens: list[int], budget: int) -> None:
    jobs = jobs_of(tokens)
    expected = fill_batches(jobs, budget, num_tokens)
    scheduler: TokenBudgetScheduler[Job] = TokenBudgetScheduler(budget)
    lanes: LaneQueue[Job] = LaneQueue(budget, starve_s=None)
    for job in jobs:
        scheduler.add(job)
        lanes.add(job)
    for batch in expected:
        assert scheduler.next_batch() == batch
        assert lanes.next_batch(now=0.0) == batch
    assert len(scheduler) == len(lanes) == 0 and scheduler.queued_tokens == lanes.queued_tokens == 0
