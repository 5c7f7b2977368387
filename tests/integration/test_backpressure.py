"""Backpressure: with a tiny in-flight budget the worker pauses its partitions and resumes them, and
what it holds stays bounded while 5,000 jobs drain."""

from __future__ import annotations

import asyncio
import random

import pytest

from kafka_scorer.wire.protocol import Job
from tests.integration.brokers import on_each_broker
from tests.integration.jobs import Sent, assert_answers, to_record
from tests.integration.kafka_helpers import InProcessWorker, decode_replies, fresh_topics, produce

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


@on_each_broker()
async def test_pauses_resumes_and_stays_bounded_while_5000_jobs_drain(
    kafka, causal_model, causal_scorer, causal_reference
) -> None:
    topics = await fresh_topics(kafka, partitions=3)
    settings = topics.settings(
        causal_model,
        max_inflight_tokens=MAX_INFLIGHT_TOKENS,
        max_batch_tokens=1024,
        max_poll_records=MAX_POLL_RECORDS,
    )
    rng = random.Random(5)
    templates = _templates(rng)
    sent = []
    for i in range(N_JOBS):
        template = templates[rng.randrange(len(templates))]
        job = Job(**{f: getattr(template, f) for f in Job.__struct_fields__ if f != "id"}, id=f"bp-{i}")
        sent.append(Sent(job, "json", key=None, correlation=None))
    records = [to_record(s, topics.requests, i % 3, with_content_type=False) for i, s in enumerate(sent)]
    largest_job = max(len(j.query) * len(j.items) + sum(len(i) for i in j.items) for j in templates)

    paused_seen: set[int] = set()
    async with InProcessWorker(settings, causal_scorer.engine) as worker:

        async def watch() -> None:
            while True:
                paused_seen.add(len(worker.worker.consumer.paused()))
                await asyncio.sleep(0.005)

        watcher = asyncio.create_task(watch())
        await produce(kafka.bootstrap, records)
        got = await topics.read_replies(N_JOBS, timeout_s=150)
        committed, ends = await topics.wait_for_commits(N_JOBS)
        watcher.cancel()
        w = worker.worker
        pauses, resumes = w.metrics.pauses._value.get(), w.ledger.resumes
        peak_tokens, peak_jobs = w.ledger.peak_tokens, w.ledger.peak_jobs
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

    assert_answers(decode_replies(got), sent, causal_reference)
    assert committed == ends
