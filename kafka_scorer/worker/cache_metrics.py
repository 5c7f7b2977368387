"""The engine's caches (and its CUDA graphs) in the worker's Prometheus registry, read when scraped.

The counters live in the engine (`Scorer.prefix_cache_stats`, a late-interaction engine's
`embedding_cache_stats`, `Scorer.graph_stats`: plain integers), so the worker imports no torch and
keeps no second copy: a collector reads them at each scrape. An engine without the cache (off, another
model kind, a test's fake engine) exports nothing. One `CacheSeries` per cache says its names; the
collecting is written once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

Described = tuple[tuple[str, str], ...]
"""(field of the engine's stats, help text) pairs."""


@dataclass(frozen=True)
class CacheSeries:
    prefix: str
    """Metric names start with it: `kafka_scorer_prefix_cache_` + field."""
    stats: str
    """The engine attribute holding the stats (None or absent: nothing is exported)."""
    counters: Described
    gauges: Described

    @property
    def exported(self) -> dict[str, str]:
        """The series this cache adds to /metrics, by type (docs/operations.md lists them)."""
        return {
            **{f"{self.prefix}{name}_total": "counter" for name, _ in self.counters},
            **{f"{self.prefix}{name}": "gauge" for name, _ in self.gauges},
        }

    def watch(self, registry: Any, engine: object) -> None:
        """Export `engine.<stats>` (when it has one) from `registry`."""
        registry.register(_Collector(self, lambda: getattr(engine, self.stats, None)))


class _Collector:
    def __init__(self, series: CacheSeries, read: Callable[[], Any]) -> None:
        self._series = series
        self._read = read

    def collect(self) -> Iterator[Metric]:
        stats = self._read()
        if stats is None:
            return
        prefix = self._series.prefix
        for name, doc in self._series.counters:
            yield CounterMetricFamily(prefix + name, doc, value=getattr(stats, name))
        for name, doc in self._series.gauges:
            yield GaugeMetricFamily(prefix + name, doc, value=getattr(stats, name))


PREFIX_CACHE = CacheSeries(
    "kafka_scorer_prefix_cache_",
    "prefix_cache_stats",
    counters=(
        ("hits", "Job pieces that attended to a cached prompt prefix instead of running it"),
        ("misses", "Job pieces with a cacheable prompt prefix that was not cached"),
        ("evictions", "Prefixes dropped from the prefix cache, least recently used first"),
    ),
    gauges=(
        ("entries", "Prefixes held in the prefix cache"),
        ("bytes", "Device memory held by the prefix cache"),
        ("peak_bytes", "Most device memory the prefix cache has held"),
        ("capacity_bytes", "The prefix cache's bound (prefix_cache_mb)"),
    ),
)

EMBEDDING_CACHE = CacheSeries(
    "kafka_scorer_embedding_cache_",
    "embedding_cache_stats",
    counters=(
        ("hits", "Documents whose token vectors came from the embedding cache instead of a forward"),
        ("misses", "Documents looked up in the embedding cache and not found"),
        ("evictions", "Documents dropped from the embedding cache, least recently used first"),
    ),
    gauges=(
        ("entries", "Documents held in the embedding cache"),
        ("bytes", "Device memory held by the embedding cache"),
        ("capacity_bytes", "The embedding cache's bound (embedding_cache_mb)"),
    ),
)

CUDA_GRAPHS = CacheSeries(
    "kafka_scorer_cuda_graph_",
    "graph_stats",
    counters=(("replays", "Forwards whose decoder body replayed a CUDA graph captured at warm-up"),),
    gauges=(("buckets", "Token buckets with a captured CUDA graph"),),
)

ENGINE_SERIES = (PREFIX_CACHE, EMBEDDING_CACHE, CUDA_GRAPHS)
"""Every engine series the worker exports (docs/operations.md's metric table lists their names)."""
