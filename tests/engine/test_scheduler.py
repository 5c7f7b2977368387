from __future__ import annotations

from kafka_scorer.engine.inputs import PreparedJob
from kafka_scorer.engine.scheduler import TokenBudgetScheduler
from kafka_scorer.protocol import Job


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
