"""A late-interaction engine's document embedding cache in the worker's Prometheus registry, read when
scraped (as `prefix_metrics.py` does for the prefix cache): the counters live in the engine
(`embedding_cache_stats`), so the worker keeps no second copy. Other engines export nothing."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

_PREFIX = "kafka_scorer_embedding_cache_"
_COUNTERS = (
    ("hits", "Documents whose token vectors came from the embedding cache instead of a forward"),
    ("misses", "Documents looked up in the embedding cache and not found"),
    ("evictions", "Documents dropped from the embedding cache, least recently used first"),
)
_GAUGES = (
    ("entries", "Documents held in the embedding cache"),
    ("bytes", "Device memory held by the embedding cache"),
    ("capacity_bytes", "The embedding cache's bound (embedding_cache_mb)"),
)

EXPORTED = {
    **{f"{_PREFIX}{name}_total": "counter" for name, _ in _COUNTERS},
    **{f"{_PREFIX}{name}": "gauge" for name, _ in _GAUGES},
}
"""The series a late-interaction engine adds to /metrics, by type (docs/operations.md lists them)."""


class EmbeddingCacheCollector:
    def __init__(self, read: Callable[[], Any]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        stats = self._read()
        if stats is None:
            return
        for name, doc in _COUNTERS:
            yield CounterMetricFamily(_PREFIX + name, doc, value=getattr(stats, name))
        for name, doc in _GAUGES:
            yield GaugeMetricFamily(_PREFIX + name, doc, value=getattr(stats, name))


def watch_embedding_cache(registry: Any, engine: object) -> None:
    """Export `engine.embedding_cache_stats` (when it has one) from `registry`."""
    registry.register(EmbeddingCacheCollector(lambda: getattr(engine, "embedding_cache_stats", None)))
