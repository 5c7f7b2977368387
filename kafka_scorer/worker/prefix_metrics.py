"""The engine's prefix cache in the worker's Prometheus registry, read when scraped.

The counters live in the engine (`Scorer.prefix_cache_stats`, plain integers), so the worker imports no
torch and keeps no second copy: a collector reads them at each scrape. An engine without a prefix
cache (off, an encoder, a test's fake engine) exports nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

_COUNTERS = (
    ("hits", "Job pieces that attended to a cached prompt prefix instead of running it"),
    ("misses", "Job pieces with a cacheable prompt prefix that was not cached"),
    ("evictions", "Prefixes dropped from the prefix cache, least recently used first"),
)
_GAUGES = (
    ("entries", "Prefixes held in the prefix cache"),
    ("bytes", "Device memory held by the prefix cache"),
    ("peak_bytes", "Most device memory the prefix cache has held"),
    ("capacity_bytes", "The prefix cache's bound (prefix_cache_mb)"),
)


EXPORTED = {
    **{f"kafka_scorer_prefix_cache_{name}_total": "counter" for name, _ in _COUNTERS},
    **{f"kafka_scorer_prefix_cache_{name}": "gauge" for name, _ in _GAUGES},
}
"""The series an engine with a prefix cache adds to /metrics, by type (docs/operations.md lists them)."""


class PrefixCacheCollector:
    def __init__(self, read: Callable[[], Any]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        stats = self._read()
        if stats is None:
            return
        for name, doc in _COUNTERS:
            yield CounterMetricFamily(f"kafka_scorer_prefix_cache_{name}", doc, value=getattr(stats, name))
        for name, doc in _GAUGES:
            yield GaugeMetricFamily(f"kafka_scorer_prefix_cache_{name}", doc, value=getattr(stats, name))


def watch_prefix_cache(registry: Any, engine: object) -> None:
    """Export `engine.prefix_cache_stats` (when it has one) from `registry`."""
    registry.register(PrefixCacheCollector(lambda: getattr(engine, "prefix_cache_stats", None)))
