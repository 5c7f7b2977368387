"""A late-interaction engine's embedding-cache counters reach the worker's /metrics, read at each scrape."""

from __future__ import annotations

from kafka_scorer.engine.late_interaction.embedding_cache import EmbeddingCacheStats
from kafka_scorer.worker.cache_metrics import EMBEDDING_CACHE
from kafka_scorer.worker.metrics import WorkerMetrics


class Engine:
    def __init__(self, stats: EmbeddingCacheStats | None) -> None:
        self.embedding_cache_stats = stats


def test_counters_are_read_at_each_scrape():
    metrics = WorkerMetrics()
    engine = Engine(
        EmbeddingCacheStats(hits=7, misses=3, evictions=1, entries=5, bytes=640, capacity_bytes=1 << 20)
    )
    EMBEDDING_CACHE.watch(metrics.registry, engine)
    text = metrics.render().decode()
    assert "kafka_scorer_embedding_cache_hits_total 7.0" in text
    assert "kafka_scorer_embedding_cache_bytes 640.0" in text
    assert all(f"{name} " in text for name in EMBEDDING_CACHE.exported)  # the names docs/operations.md lists
    engine.embedding_cache_stats = EmbeddingCacheStats(12, 3, 1, 5, 640, 1 << 20)
    assert "kafka_scorer_embedding_cache_hits_total 12.0" in metrics.render().decode()


def test_an_engine_without_one_exports_nothing():
    metrics = WorkerMetrics()
    EMBEDDING_CACHE.watch(metrics.registry, Engine(None))
    assert "embedding_cache" not in metrics.render().decode()
