"""The engine's counters (embedding cache, CUDA graphs) reach the worker's /metrics, read at each scrape."""

from __future__ import annotations

from kafka_scorer.engine.pack.embedding_cache import EmbeddingCacheStats
from kafka_scorer.wire.engine_stats import EngineStats, counters
from kafka_scorer.worker.cache_metrics import EMBEDDING_CACHE
from kafka_scorer.worker.metrics import WorkerMetrics
from tests.worker.conftest import FakeEngine


def engine_with(stats: EmbeddingCacheStats | None) -> FakeEngine:
    engine = FakeEngine()
    engine.counters = EngineStats(embedding_cache=counters(stats))
    return engine


def test_counters_are_read_at_each_scrape():
    metrics = WorkerMetrics()
    engine = engine_with(
        EmbeddingCacheStats(hits=7, misses=3, evictions=1, entries=5, bytes=640, capacity_bytes=1 << 20)
    )
    EMBEDDING_CACHE.watch(metrics.registry, engine)
    text = metrics.render().decode()
    assert "kafka_scorer_embedding_cache_hits_total 7.0" in text
    assert "kafka_scorer_embedding_cache_bytes 640.0" in text
    assert all(f"{name} " in text for name in EMBEDDING_CACHE.exported)  # the names docs/operations.md lists
    engine.counters = EngineStats(embedding_cache=counters(EmbeddingCacheStats(12, 3, 1, 5, 640, 1 << 20)))
    assert "kafka_scorer_embedding_cache_hits_total 12.0" in metrics.render().decode()


def test_an_engine_without_one_exports_nothing():
    metrics = WorkerMetrics()
    EMBEDDING_CACHE.watch(metrics.registry, engine_with(None))
    assert "embedding_cache" not in metrics.render().decode()


def test_cuda_graph_replays_are_read_from_a_real_engine(tiny_models):
    """A CPU Scorer with graphs asked for (flex, uncaptured): its replays reach /metrics as they happen."""
    from kafka_scorer.engine.scorer import Scorer
    from kafka_scorer.wire.protocol import Job
    from kafka_scorer.worker.cache_metrics import CUDA_GRAPHS

    options = dict(attention_backend="flex", max_batch_tokens=512, cuda_graph_tokens=256, prefix_cache_mb=0)
    scorer = Scorer(str(tiny_models.get()), dtype="float32", device="cpu", **options)
    metrics = WorkerMetrics()
    CUDA_GRAPHS.watch(metrics.registry, scorer.engine)
    assert "cuda_graph" not in metrics.render().decode()  # nothing captured before the warm-up
    scorer.engine.warm_up()
    before = scorer.describe().cuda_graphs.replays
    scorer.score_jobs([Job(query=[5, 6, 7], items=[[8, 9]], label_token_ids=[3])])
    text = metrics.render().decode()
    assert f"kafka_scorer_cuda_graph_replays_total {before + 1:.1f}" in text
    assert "kafka_scorer_cuda_graph_buckets 2.0" in text
