"""Backpressure: with a tiny in-flight budget the worker pauses its partitions and resumes them, and
what it holds stays bounded while 5,000 jobs drain."""

from __future__ import annotations

import asyncio
import random

import msgspec
import pytest

from kafka_scorer.protocol import Job, decode_result
from tests.integration.jobs import Reference, max_abs_diff
from tests.integration.kafka_helpers import (
    InProcessWorker,
    Out,
    create_topics,
    produce,
    read_topic,
    unique,
    wait_for_commits,
    worker_settings,
)

pytestmark = pytest.mark.integration

N_JOBS = 5000
MAX_INFLIGHT_TOKENS = 1500
MAX_POLL_RECORDS = 100


def _templates(rng: random.Random) -> list[Job]:
    """A few distinct jobs so the reference is computed once per template, not 5,000 times."""
    jobs = []
    for _ in range(12):
        query = [rng.randrange(4, 380) for _ in range(rng.randint(2, 5))]
        items = [[rng.randrange(4, 380) for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(1, 3))]
        jobs.append(Job(query=query, items=items, label_token_ids=[3, 77], apply_softmax=rng.random() < 0.5))
    return jobs


async def test_pauses_resumes_and_stays_bounded_while_5000_jobs_drain(
    kafka, causal_model, causal_scorer
) -> None:
    requests, replies, group = unique("req"), unique("res"), unique("group")
    await create_topics(kafka.bootstrap, [requests, replies], partitions=3)
    settings = worker_settings(
        kafka,
        causal_model,
        request_topics=[requests],
        reply_topic=replies,
        group_id=group,
        max_inflight_tokens=MAX_INFLIGHT_TOKENS,
        max_batch_tokens=1024,
        max_poll_records=MAX_POLL_RECORDS,
    )
    rng = random.Random(5)
    templates = _templates(rng)
    plan = [(f"bp-{i}", rng.randrange(len(templates))) for i in range(N_JOBS)]
    records = []
    for i, (job_id, t) in enumerate(plan):
        job = Job(**{f: getattr(templates[t], f) for f in Job.__struct_fields__ if f != "id"}, id=job_id)
        records.append(Out(requests, msgspec.json.encode(job), partition=i % 3))
    largest_job = max(len(j.query) * len(j.items) + sum(len(i) for i in j.items) for j in templates)

    paused_seen: set[int] = set()
    async with InProcessWorker(settings, causal_scorer) as worker:

        async def watch() -> None:
            while True:
                paused_seen.add(len(worker.worker.consumer.paused()))
                await asyncio.sleep(0.005)

        watcher = asyncio.create_task(watch())
        await produce(kafka.bootstrap, records)
        got = await read_topic(kafka.bootstrap, replies, lambda rs: len(rs) >= N_JOBS, timeout_s=150)
        committed, ends = await wait_for_commits(kafka.bootstrap, group, requests, 3, N_JOBS)
        watcher.cancel()
        w = worker.worker
        pauses, resumes = w.metrics.pauses._value.get(), w.resumes
        peak_tokens, peak_jobs = w.peak_inflight_tokens, w.peak_inflight_jobs
        assert await worker.stop() == 0

    print(
        f"backpressure: {pauses:.0f} pauses, {resumes} resumes, peak {peak_tokens} tokens / {peak_jobs} jobs"
    )
    assert pauses >= 1 and resumes >= 1
    assert 3 in paused_seen and 0 in paused_seen  # all partitions paused at some point, and resumed
    # The bound: the budget plus at most one poll's worth of the largest job (the poll that crossed it).
    assert peak_tokens <= MAX_INFLIGHT_TOKENS + MAX_POLL_RECORDS * largest_job
    assert peak_jobs <= 4 * MAX_POLL_RECORDS + MAX_POLL_RECORDS
    assert peak_jobs < N_JOBS // 10  # far from "everything fetched at once"

    results = {}
    for record in got:
        result = decode_result(record.value)
        assert result.id not in results, f"{result.id} answered twice"
        results[result.id] = result
    assert set(results) == {job_id for job_id, _ in plan}
    reference = Reference(causal_model)
    for job_id, t in plan:
        scores = results[job_id].scores
        assert scores is not None
        assert max_abs_diff(scores, reference.scores(templates[t])) <= 1e-4
    assert committed == ends
