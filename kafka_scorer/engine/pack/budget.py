"""The token budget's one rule, for every place that fills a batch: the worker's lanes (what goes into the
next batch), the engine's scheduler and its forward planner (which pieces run in one forward).

A batch takes jobs in the order it is given while each fits: the tokens taken plus the job's stay
within the budget (equal fits). It stops at the first job that does not fit instead of looking past it
for a smaller one, so the order the caller chose (arrival, priority, a job's items) is the order that
runs. A job larger than the whole budget fits an empty batch, alone: it runs instead of waiting for a
budget it can never have (the planner cuts such a job first where it can).

Only the size counts, told by `size` (a job's `num_tokens`, an item's length), so this module needs
neither torch nor Kafka: the worker imports it without loading the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")


class Counted(Protocol):
    """Anything with a token count: what the budget is spent on."""

    @property
    def num_tokens(self) -> int: ...


def num_tokens(job: Counted) -> int:
    """The size of a job: its token count (the `size` of every caller but the item cutter)."""
    return job.num_tokens


class BudgetFill(Generic[T]):
    """One batch as it fills: `jobs` in the order taken, `tokens` their sizes' sum."""

    def __init__(self, budget: int, size: Callable[[T], int]) -> None:
        self.budget = budget
        self.size = size
        self.jobs: list[T] = []
        self.tokens = 0

    def fits(self, job: T) -> bool:
        """Within the budget, or the first job of the batch (however large)."""
        return not self.jobs or self.tokens + self.size(job) <= self.budget

    def add(self, job: T) -> None:
        self.jobs.append(job)
        self.tokens += self.size(job)

    def take(self, jobs: Iterable[T]) -> T | None:
        """Take `jobs` in order until one does not fit: that one is returned (None when all fitted)."""
        for job in jobs:
            if not self.fits(job):
                return job
            self.add(job)
        return None


def fill_batches(jobs: Iterable[T], budget: int, size: Callable[[T], int]) -> list[list[T]]:
    """`jobs` cut, in order, into consecutive batches, each filled by the rule until the next job does not
    fit; nothing is dropped or reordered."""
    batches: list[list[T]] = []
    fill = BudgetFill(budget, size)
    for job in jobs:
        if not fill.fits(job):
            batches.append(fill.jobs)
            fill = BudgetFill(budget, size)
        fill.add(job)
    if fill.jobs:
        batches.append(fill.jobs)
    return batches
