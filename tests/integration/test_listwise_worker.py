"""A listwise checkpoint (jina-reranker-v3's layout) made by `kafka-scorer model` and served by the
worker through a real broker: jobs sent together, so the worker batches them, each answered with the
scores the independent reference gives the job alone (kafka_scorer_bench/listwise_reference.py): items read
together, the rerank shape, a job past one block, `multi_item: false`, and a refused field typed."""

from __future__ import annotations

import asyncio

import pytest

from kafka_scorer.client import ScoringClient
from kafka_scorer.wire.protocol import ErrorCode, Job
from kafka_scorer_bench.listwise_reference import TOLERANCE, Reference
from tests.integration.kafka_helpers import InProcessWorker, fresh_topics

pytestmark = pytest.mark.integration

QUERY = "what is green tea good for?"
DOCS = [
    "Green tea has catechins.",
    "Coffee prices rose.",
    "Tea may help the brain.",
    "Basketball is popular.",
]
MANY = [f"document number {i} about tea" if i % 3 else f"coffee note {i}" for i in range(130)]


def _jobs() -> list[Job]:
    objects = [{"text": doc, "id": i} for i, doc in enumerate(DOCS)]
    return [
        Job(id="items", query=QUERY, items=DOCS, top_n=2),
        Job(id="reversed", query=QUERY, items=DOCS[::-1]),
        Job(id="rerank", query=QUERY, documents=objects, top_n=2, return_documents=True),
        Job(id="blocks", query=QUERY, items=MANY),
        Job(id="single", query=QUERY, items=DOCS, multi_item=False),
        Job(id="refused", query=QUERY, items=DOCS, label_token_ids=[1]),
    ]


def _close(got: list[float], want: list[float], job_id: str) -> None:
    assert got == pytest.approx(want, abs=TOLERANCE), job_id


async def test_the_worker_serves_a_listwise_checkpoint_made_by_the_model_command(kafka, tmp_path) -> None:
    from kafka_scorer.cli import main as cli_main
    from kafka_scorer.engine.scorer import Scorer

    path = tmp_path / "jina"
    assert cli_main(["model", "jina-reranker-v3", str(path)]) == 0
    scorer = Scorer(str(path), dtype="float32", device="cpu", max_items_per_job=256)
    topics = await fresh_topics(kafka, partitions=1)
    client = ScoringClient(kafka.bootstrap, topics.requests, topics.replies, fetch_max_wait_ms=20)
    jobs = _jobs()
    async with InProcessWorker(topics.settings(path, max_items_per_job=256), scorer.engine), client:
        results = {r.id: r for r in await asyncio.gather(*(client.request(job) for job in jobs))}
    reference = Reference(path)
    refused = results.pop("refused").error
    assert refused is not None and refused.code is ErrorCode.UNSUPPORTED
    for job in jobs[:2] + jobs[3:4]:
        result = results[job.id]
        assert result.error is None, (job.id, result.error)
        _close([row[0] for row in result.scores], reference.scores(QUERY, list(job.items)), job.id)
    single = results["single"]
    _close([row[0] for row in single.scores], [reference.scores(QUERY, [d])[0] for d in DOCS], "single")
    want = reference.scores(QUERY, DOCS)
    order = sorted(range(len(DOCS)), key=lambda i: -want[i])[:2]
    assert [entry.index for entry in results["items"].ranking] == order
    rerank = results["rerank"]
    assert rerank.error is None and [entry.index for entry in rerank.results] == order
    for entry in rerank.results:
        assert entry.relevance_score == pytest.approx(want[entry.index], abs=TOLERANCE)
        assert entry.document == {"text": DOCS[entry.index], "id": entry.index}
