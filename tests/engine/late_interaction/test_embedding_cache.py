"""The document embedding cache: a document re-ranked against another query is not encoded again, its
tokens are reported in `cached_tokens`, and the scores are those of an uncached scorer (bit for bit in
deterministic mode: tests/cuda_tests/test_deterministic_cuda.py, whose `cpu` variant runs here too)."""

from __future__ import annotations

import pytest
import torch

from kafka_scorer.engine.pack.embedding_cache import EmbeddingCache
from kafka_scorer.wire.protocol import Job
from tests.engine.passages import PASSAGES, QUERIES


def scores(result) -> list[float]:
    return [row[0] for row in result.scores]


def test_second_query_over_the_same_documents_reads_the_cache(colbert_scorer):
    cached = colbert_scorer(embedding_cache_mb=4)
    cached.describe().kind.forget()
    plain = colbert_scorer()
    first = cached.score(QUERIES[0], PASSAGES[:6])
    second = cached.score(QUERIES[1], PASSAGES[:6])
    assert first.cached_tokens == 0
    doc_tokens = first.prompt_tokens - cached.describe().loaded.late.settings.query_length
    assert second.cached_tokens == doc_tokens
    assert second.prompt_tokens == cached.describe().loaded.late.settings.query_length
    assert scores(second) == pytest.approx(scores(plain.score(QUERIES[1], PASSAGES[:6])), abs=1e-5)
    assert scores(first) == pytest.approx(scores(plain.score(QUERIES[0], PASSAGES[:6])), abs=1e-5)
    stats = cached.describe().embedding_cache
    assert stats.hits == 6 and stats.entries == 6


def test_a_document_twice_in_one_batch_is_encoded_once(colbert_scorer):
    from kafka_scorer.engine.late_interaction.forward import build_late_forward

    scorer = colbert_scorer()
    jobs = [
        scorer.engine.prepare(Job(query=q, items=PASSAGES[:3]), str(i)) for i, q in enumerate(QUERIES[:3])
    ]
    forward = build_late_forward(list(enumerate(jobs)), scorer.describe().loaded, None)
    assert len(forward.fills) == 3
    results = scorer.engine.run_batch(jobs)
    for query, result in zip(QUERIES[:3], results):
        assert scores(result) == pytest.approx(scores(scorer.score(query, PASSAGES[:3])), abs=1e-5)


def test_the_cache_is_bounded_least_recently_used_first():
    cache = EmbeddingCache(3 * 4 * 4, ("rev", "float32"))
    for key in (b"a", b"b", b"c"):
        cache.put(key, torch.zeros(1, 4))
    cache.put(b"big", torch.zeros(4, 4))  # over the whole bound: not kept
    assert cache.get(b"a") is not None  # a is now the most recent
    cache.put(b"d", torch.zeros(1, 4))
    assert cache.get(b"b") is None and cache.get(b"a") is not None and cache.get(b"d") is not None
    stats = cache.stats()
    assert stats.evictions == 1 and stats.bytes <= stats.capacity_bytes and stats.entries == 3


def test_entries_of_another_revision_are_never_read():
    vectors = torch.ones(2, 4)
    EmbeddingCache(1 << 20, ("r1", "float32")).put(b"k", vectors)
    shared = EmbeddingCache(1 << 20, ("r1", "float32"))
    shared.put(b"k", vectors)
    shared.namespace = ("r2", "float32")
    assert shared.get(b"k") is None


def test_the_warm_up_leaves_no_document_in_the_cache(tiny_colbert):
    """The warm-up's documents are no traffic's: its forwards fill the cache, and start-up empties it
    (`engine/load/warm_up.py`, through the kind's `forget`), so no job is counted as served from them."""
    from kafka_scorer.engine.scorer import Scorer

    scorer = Scorer(str(tiny_colbert()), device="cpu", dtype="float32", embedding_cache_mb=4)
    scorer.engine.warm_up()
    stats = scorer.describe().embedding_cache
    assert stats is not None and stats.misses > 0, "the warm-up ran no document through the cache"
    assert stats.entries == 0 and stats.bytes == 0
