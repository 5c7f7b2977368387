"""A ColBERT checkpoint served by the worker through a real broker: MaxSim scores equal to
sentence-transformers' MultiVectorEncoder, a second query over the same documents read from the
embedding cache (`cached_tokens`), a job in the rerank shape (`documents`) answered with `results`, and a
field this kind cannot use answered `unsupported`."""

from __future__ import annotations

import pytest

from kafka_scorer.client import ScoringClient
from kafka_scorer.wire.protocol import ErrorCode, Job
from tests.engine.passages import PASSAGES, QUERIES
from tests.integration.kafka_helpers import InProcessWorker, fresh_topics

pytestmark = pytest.mark.integration


async def test_the_worker_serves_a_colbert_checkpoint(kafka, tmp_path) -> None:
    from sentence_transformers import MultiVectorEncoder

    from kafka_scorer.checkpoints.tiny_colbert import build_tiny_colbert
    from kafka_scorer.engine.scorer import Scorer

    path = build_tiny_colbert(tmp_path / "colbert")
    scorer = Scorer(str(path), dtype="float32", device="cpu")
    topics = await fresh_topics(kafka, partitions=1)
    client = ScoringClient(kafka.bootstrap, topics.requests, topics.replies, fetch_max_wait_ms=20)
    async with InProcessWorker(topics.settings(path), scorer.engine), client:
        first = await client.score(QUERIES[0], PASSAGES[:4])
        second = await client.score(QUERIES[1], PASSAGES[:4], top_n=2)
        refused = await client.request(Job(id="labels", query="q", items=["d"], label_token_ids=[1]))
        objects = [{"text": passage, "id": i} for i, passage in enumerate(PASSAGES[:4])]
        reranked = await client.request(
            Job(id="rerank", query=QUERIES[1], documents=objects, top_n=2, return_documents=True)
        )
    encoder = MultiVectorEncoder(str(path), device="cpu")
    documents = encoder.encode_document(PASSAGES[:4])
    for query, result in ((QUERIES[0], first), (QUERIES[1], second)):
        expected = encoder.similarity(encoder.encode_query([query]), documents)[0].tolist()
        assert [row[0] for row in result.scores] == pytest.approx(expected, abs=1e-4)
    assert first.cached_tokens == 0 and second.cached_tokens > 0
    assert [entry.index for entry in second.ranking] == sorted(range(4), key=lambda i: -second.scores[i][0])[
        :2
    ]
    assert refused.error is not None and refused.error.code is ErrorCode.UNSUPPORTED
    expected = encoder.similarity(encoder.encode_query([QUERIES[1]]), documents)[0].tolist()
    assert reranked.error is None and reranked.ranking is None
    assert [entry.index for entry in reranked.results] == sorted(range(4), key=lambda i: -expected[i])[:2]
    for entry in reranked.results:
        assert entry.relevance_score == pytest.approx(expected[entry.index], abs=1e-4)
        assert entry.document == objects[entry.index]
