"""What goes into the next batch: priority lanes, earliest deadline first, aging, and the budget rule.

The queue is pure Python; `Job` stands for a ticket (token count, priority, deadline, enqueue time).
Generated arrivals check the properties; a few named cases pin the documented numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from kafka_scorer.worker.priority_lanes import LaneQueue


@dataclass(eq=False)
class Job:
    name: str
    num_tokens: int = 10
    priority: int = 0
    deadline: float | None = None
    enqueued_at: float = 0.0


def names(jobs: list[Job]) -> list[str]:
    return [j.name for j in jobs]


def test_higher_priority_first_then_earliest_deadline_then_arrival() -> None:
    q: LaneQueue[Job] = LaneQueue(max_batch_tokens=1000, starve_s=10.0)
    for job in [
        Job("bulk-a", priority=-1),
        Job("plain-late", deadline=9.0),
        Job("plain-none"),
        Job("plain-soon", deadline=2.0),
        Job("urgent", priority=5),
        Job("bulk-b", priority=-1),
    ]:
        q.add(job)
    assert names(q.next_batch(now=0.0)) == [
        "urgent",
        "plain-soon",
        "plain-late",
        "plain-none",
        "bulk-a",
        "bulk-b",
    ]


def test_fifo_ignores_priorities_and_deadlines() -> None:
    q: LaneQueue[Job] = LaneQueue(max_batch_tokens=1000, starve_s=None)
    q.add(Job("a", priority=-5))
    q.add(Job("b", priority=5, deadline=1.0))
    assert names(q.next_batch(now=0.0)) == ["a", "b"]


def test_a_starving_job_gets_the_share_once_it_has_waited_and_fresh_ones_still_go_first() -> None:
    """A bulk job (priority 0) keeps losing to interactive jobs (priority 1) until it has waited
    `starve_s`; from then on each batch takes it first within the share, and the interactive jobs fill
    the rest of that same batch: it does not wait for the whole lane, and they do not wait behind it."""
    q: LaneQueue[Job] = LaneQueue(max_batch_tokens=40, starve_s=2.0, share=0.25)  # share: one job
    q.add(Job("bulk-old", priority=0, enqueued_at=0.0))
    q.add(Job("bulk-new", priority=0, enqueued_at=1.9))
    for i in range(6):
        q.add(Job(f"i{i}", priority=1, enqueued_at=1.9, deadline=60.0))
    assert names(q.next_batch(now=1.95)) == ["i0", "i1", "i2", "i3"], "not starving yet"
    assert names(q.next_batch(now=2.0)) == ["bulk-old", "i4", "i5", "bulk-new"]


def test_with_only_one_priority_queued_nothing_is_starving() -> None:
    q: LaneQueue[Job] = LaneQueue(max_batch_tokens=20, starve_s=1.0, share=0.5)
    q.add(Job("late", deadline=50.0, enqueued_at=0.0))
    q.add(Job("soon", deadline=5.0, enqueued_at=9.0))
    assert names(q.next_batch(now=10.0)) == ["soon", "late"], "earliest deadline first, however long"


def test_the_share_bounds_how_much_old_work_goes_ahead_of_a_fresh_interactive_job() -> None:
    q: LaneQueue[Job] = LaneQueue(max_batch_tokens=100, starve_s=1.0, share=0.25)
    for i in range(20):
        q.add(Job(f"bulk-{i}", priority=-1, enqueued_at=0.0))
    q.add(Job("live", priority=1, enqueued_at=30.0, deadline=31.0))
    batch = names(q.next_batch(now=30.0))
    assert batch[:2] == ["bulk-0", "bulk-1"] and batch[2] == "live", (
        "25 of 100 tokens: two old jobs, then live"
    )


def test_the_budget_takes_jobs_in_order_and_a_giant_runs_alone() -> None:
    q: LaneQueue[Job] = LaneQueue(max_batch_tokens=30, starve_s=1.0)
    q.add(Job("giant", num_tokens=100))
    q.add(Job("small", num_tokens=5, priority=-1))
    assert names(q.next_batch(0.0)) == ["giant"]
    assert names(q.next_batch(0.0)) == ["small"] and q.queued_tokens == 0


def test_expired_jobs_leave_the_queue_and_the_next_expiry_is_known() -> None:
    q: LaneQueue[Job] = LaneQueue(max_batch_tokens=100, starve_s=1.0)
    q.add(Job("a", deadline=1.0))
    q.add(Job("b", deadline=3.0))
    q.add(Job("c"))
    assert q.next_expiry() == 1.0
    assert names(q.expire(now=2.0)) == ["a"]
    assert q.next_expiry() == 3.0 and q.queued_tokens == 20 and len(q) == 2


jobs = st.lists(
    st.tuples(
        st.integers(1, 40),
        st.integers(-3, 3),
        st.one_of(st.none(), st.floats(0, 20)),
        st.floats(0, 10),
    ),
    max_size=40,
)


@given(jobs, st.floats(0, 30), st.integers(1, 100), st.floats(0.05, 1.0))
def test_generated_queues_lose_nothing_and_respect_the_budget(spec, now, budget, share) -> None:
    q: LaneQueue[Job] = LaneQueue(max_batch_tokens=budget, starve_s=1.5, share=share)
    added = [Job(str(i), n, p, d, e) for i, (n, p, d, e) in enumerate(spec)]
    for job in added:
        q.add(job)
    expired = q.expire(now)
    assert all(j.deadline is not None and j.deadline <= now for j in expired)
    out: list[Job] = []
    while len(q):
        batch = q.next_batch(now)
        assert batch, "a non-empty queue always yields a batch"
        assert len(batch) == 1 or sum(j.num_tokens for j in batch) <= budget
        out += batch
    assert sorted(names(out + expired), key=int) == names(added), "every job exactly once"
    assert q.queued_tokens == 0


def drain(q: LaneQueue[Job], now: float) -> list[list[str]]:
    batches = []
    while len(q):
        batches.append(names(q.next_batch(now)))
    return batches


def test_high_priority_jobs_over_half_the_budget_do_not_wait_behind_a_starving_backlog() -> None:
    """Issue 26: every job over half the budget. The starving share may not put the whole bulk backlog
    ahead of them (one starving job per batch, each keeping the interactive job out): it saves up its
    eighth of each batch until it covers one bulk job, so the interactive jobs go first."""
    q: LaneQueue[Job] = LaneQueue(max_batch_tokens=100, starve_s=1.0, share=0.125)
    for i in range(10):
        q.add(Job(f"bulk-{i}", num_tokens=60, priority=-50, enqueued_at=0.0))
    for i in range(3):
        q.add(Job(f"high-{i}", num_tokens=60, priority=100, enqueued_at=5.0))
    assert drain(q, now=5.0)[:4] == [["high-0"], ["high-1"], ["high-2"], ["bulk-0"]]


def test_a_large_starving_job_saves_up_its_share_and_then_the_kept_out_job_goes_next() -> None:
    """Interactive jobs fill every batch; a bulk job (60 of 100 tokens) goes once five reservations of
    12.5 tokens cover it (one batch in five), and the interactive job it kept out leads the next one."""
    q: LaneQueue[Job] = LaneQueue(max_batch_tokens=100, starve_s=1.0, share=0.125)
    for i in range(3):
        q.add(Job(f"bulk-{i}", num_tokens=60, priority=-1, enqueued_at=0.0))
    batches = []
    for n in range(15):
        q.add(Job(f"high-{n}", num_tokens=60, priority=1, enqueued_at=10.0 + n))
        batches.append(names(q.next_batch(now=10.0 + n)))
    bulk_at = [n for n, batch in enumerate(batches) if batch[0].startswith("bulk")]
    assert bulk_at == [4, 9, 14], batches
    highs = [job for batch in batches for job in batch if job.startswith("high")]
    assert highs == [f"high-{n}" for n in range(12)], "the job a bulk one kept out leads the next batch"


def test_small_starving_jobs_alternate_with_interactive_jobs_too_large_to_share_a_batch() -> None:
    """90-token interactive jobs cannot share a batch with a 12-token reservation: rather than the
    share going first in every batch (and no interactive job ever fitting), the two take turns."""
    q: LaneQueue[Job] = LaneQueue(max_batch_tokens=100, starve_s=1.0, share=0.125)
    for i in range(20):
        q.add(Job(f"bulk-{i}", num_tokens=12, priority=-1, enqueued_at=0.0))
    for i in range(5):
        q.add(Job(f"high-{i}", num_tokens=90, priority=1, enqueued_at=10.0))
    batches = [names(q.next_batch(now=10.0)) for _ in range(10)]
    assert batches == [[f"{lane}-{i}"] for i in range(5) for lane in ("bulk", "high")]


@given(jobs, st.integers(1, 100), st.integers(1, 100), st.floats(0.05, 1.0), st.integers(0, 5))
def test_a_fresh_top_priority_job_waits_behind_at_most_one_batch_of_starving_work(
    spec, budget, size, share, before
) -> None:
    q: LaneQueue[Job] = LaneQueue(max_batch_tokens=budget, starve_s=1.5, share=share)
    for i, (n, p, _, e) in enumerate(spec):
        q.add(Job(str(i), n, p, None, e))
    for _ in range(before):  # whatever credit and turn earlier batches left behind
        q.next_batch(now=20.0)
    q.add(Job("fresh", min(size, budget), priority=4, enqueued_at=20.0))
    first, second = names(q.next_batch(now=20.0)), names(q.next_batch(now=20.0)) if len(q) else []
    assert "fresh" in first + second


@given(st.integers(1, 100), st.floats(0.05, 1.0), st.lists(st.integers(1, 100), min_size=40, max_size=40))
def test_a_starving_job_goes_once_its_saved_up_reservations_cover_it(size, share, stream) -> None:
    budget = 100
    q: LaneQueue[Job] = LaneQueue(max_batch_tokens=budget, starve_s=1.0, share=share)
    q.add(Job("bulk", size, priority=-1, enqueued_at=0.0))
    for n, tokens in enumerate(stream):
        q.add(Job(f"high-{n}", tokens, priority=1, enqueued_at=5.0))
        if "bulk" in names(q.next_batch(now=5.0)):
            break
    assert n + 1 <= math.ceil(size / (share * budget)) + 1, f"bulk ran in batch {n + 1}"
