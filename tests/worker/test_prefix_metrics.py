"""The engine's prefix-cache counters reach the worker's /metrics, read at each scrape."""

from __future__ import annotations

from dataclasses import dataclass

from kafka_scorer.wire.engine_stats import EngineStats, counters
from kafka_scorer.worker.cache_metrics import PREFIX_CACHE
from kafka_scorer.worker.metrics import WorkerMetrics
from tests.worker.conftest import FakeEngine


@dataclass
class Stats:
    hits: int = 3
    misses: int = 2
    evictions: int = 1
    entries: int = 4
    bytes: int = 4096
    peak_bytes: int = 8192
    capacity_bytes: int = 1 << 20


def test_counters_are_read_at_each_scrape():
    metrics = WorkerMetrics()
    engine = FakeEngine()
    engine.counters = EngineStats(prefix_cache=counters(Stats()))
    PREFIX_CACHE.watch(metrics.registry, engine)
    text = metrics.render().decode()
    assert "kafka_scorer_prefix_cache_hits_total 3.0" in text
    assert "kafka_scorer_prefix_cache_evictions_total 1.0" in text
    assert "kafka_scorer_prefix_cache_peak_bytes 8192.0" in text
    assert all(f"{name} " in text for name in PREFIX_CACHE.exported)  # the names docs/operations.md lists
    engine.counters = EngineStats(prefix_cache=counters(Stats(hits=10)))
    assert "kafka_scorer_prefix_cache_hits_total 10.0" in metrics.render().decode()


def test_an_engine_without_a_cache_exports_nothing():
    metrics = WorkerMetrics()
    PREFIX_CACHE.watch(metrics.registry, FakeEngine())
    assert "prefix_cache" not in metrics.render().decode()


def test_a_batch_counts_run_and_cached_tokens_apart():
    from types import SimpleNamespace

    from kafka_scorer.wire.protocol import Result
    from kafka_scorer.worker.batch_report import report_batch
    from kafka_scorer.worker.batcher import BatchDone
    from kafka_scorer.worker.tracing import Tracing

    metrics = WorkerMetrics()
    tickets = [
        SimpleNamespace(
            items=1,
            queue_s=0.0,
            enqueued_at=0.0,
            born=0.0,
            trace=None,
            result=Result(id=str(n), scores=[[0.5]], prompt_tokens=run, cached_tokens=cached),
        )
        for n, (run, cached) in enumerate([(50, 430), (480, 0)])
    ]
    report_batch(BatchDone(tickets, 0.1, 960), metrics, Tracing(None))  # type: ignore[arg-type]
    text = metrics.render().decode()
    assert "kafka_scorer_tokens_total 530.0" in text
    assert "kafka_scorer_cached_tokens_total 430.0" in text
