from __future__ import annotations

from kafka_scorer.engine.pack.scheduler import TokenBudgetScheduler
from kafka_scorer.engine.prepare.prepared import PreparedJob
from kafka_scorer.wire.protocol import Job


def job(tokens: int, name: str) -> PreparedJob:
    return PreparedJob(
        job_id=name,
        job=Job(query=[], items=[]),
        query=[],
        items=[[0] * tokens],
        packed=False,
        label_ids=[0],
        num_tokens=tokens,
    )


def test_batches_fill_to_the_budget_in_fifo_order():
    sched = TokenBudgetScheduler(100)
    for i, tokens in enumerate([40, 40, 30, 90, 10]):
        sched.add(job(tokens, str(i)))
    assert sched.queued_tokens == 210 and sched.full
    assert [j.job_id for j in sched.next_batch()] == ["0", "1"]
    assert [j.job_id for j in sched.next_batch()] == ["2"]
    assert [j.job_id for j in sched.next_batch()] == ["3", "4"]
    assert sched.next_batch() == [] and sched.queued_tokens == 0 and len(sched) == 0


def test_a_job_over_the_budget_runs_alone():
    sched = TokenBudgetScheduler(50)
    sched.add(job(500, "big"))
    sched.add(job(10, "small"))
    assert [j.job_id for j in sched.next_batch()] == ["big"]
    assert [j.job_id for j in sched.next_batch()] == ["small"]


def test_plan_cuts_oversized_jobs_between_items_and_repeats_the_query_of_packed_ones():
    from kafka_scorer.engine.pack.scheduler import plan_forwards

    big = PreparedJob(
        job_id="big",
        job=Job(query=[], items=[]),
        query=[],
        items=[[0] * 30] * 7,
        packed=False,
        label_ids=[0],
        num_tokens=210,
    )
    packed = PreparedJob(
        job_id="mis",
        job=Job(query=[], items=[]),
        query=[0] * 50,
        items=[[0] * 40] * 2,
        packed=True,
        label_ids=[0],
        num_tokens=130,
    )
    lone = PreparedJob(
        job_id="lone",
        job=Job(query=[], items=[]),
        query=[0] * 90,
        items=[[0] * 40],
        packed=False,
        label_ids=[0],
        num_tokens=130,
    )
    plan = plan_forwards([job(20, "small"), big, packed, lone], 100)
    assert [[(i, len(p.items), p.num_tokens) for i, p in group] for group in plan] == [
        [(0, 1, 20)],
        [(1, 3, 90)],
        [(1, 3, 90)],
        [(1, 1, 30)],
        [(2, 1, 90)],  # query 50 + one item 40, twice: the query is repeated in each piece
        [(2, 1, 90)],
        [(3, 1, 130)],  # one item cannot be cut: it runs whole, alone
    ]
