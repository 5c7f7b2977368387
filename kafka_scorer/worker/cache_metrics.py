"""The engine's caches (and its CUDA graphs) in the worker's Prometheus registry, read when scraped.

The counters live in the engine and come through the seam's one typed call, `Engine.stats()`
(wire/engine_stats.py: plain integers by name), so the worker imports no torch and keeps no second
copy: a collector reads them at each scrape. An engine without the cache (off, another model kind, a
test's fake engine) exports nothing. One `CacheSeries` per cache says its names and which part of the
stats it reads; the collecting is written once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from kafka_scorer.wire.engine_stats import Counters, EngineStats

Described = tuple[tuple[str, str], ...]
"""(field of the engine's stats, help text) pairs."""


class Counted(Protocol):
    """What the collectors need of the engine (`Engine.stats`, worker/engine.py)."""

    def stats(self) -> EngineStats: ...


@dataclass(frozen=True)
class CacheSeries:
    prefix: str
    """Metric names start with it: `kafka_scorer_prefix_cache_` + field."""
    part: Callable[[EngineStats], Counters | None]
    """This cache's counters among the engine's stats (None: nothing is exported)."""
    counters: Described
    gauges: Described

    @property
    def exported(self) -> dict[str, str]:
        """The series this cache adds to /metrics, by type (docs/operations.md lists them)."""
        return {
            **{f"{self.prefix}{name}_total": "counter" for name, _ in self.counters},
            **{f"{self.prefix}{name}": "gauge" for name, _ in self.gauges},
        }

    def watch(self, registry: Any, engine: Counted) -> None:
        """Export this part of `engine.stats()` (when it has one) from `registry`."""
        registry.register(_Collector(self, lambda: self.part(engine.stats())))


class _Collector:
    def __init__(self, series: CacheSeries, read: Callable[[], Counters | None]) -> None:
        self._series = series
        self._read = read

    def collect(self) -> Iterator[Metric]:
        stats = self._read()
        if stats is None:
            return
        prefix = self._series.prefix
        for name, doc in self._series.counters:
            yield CounterMetricFamily(prefix + name, doc, value=stats[name])
        for name, doc in self._series.gauges:
            yield GaugeMetricFamily(prefix + name, doc, value=stats[name])


PREFIX_CACHE = CacheSeries(
    "kafka_scorer_prefix_cache_",
    lambda stats: stats.prefix_cache,
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
    lambda stats: stats.embedding_cache,
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
    lambda stats: stats.cuda_graphs,
    counters=(("replays", "Forwards whose decoder body replayed a CUDA graph captured at warm-up"),),
    gauges=(("buckets", "Token buckets with a captured CUDA graph"),),
)

ENGINE_SERIES = (PREFIX_CACHE, EMBEDDING_CACHE, CUDA_GRAPHS)
"""Every engine series the worker exports (docs/operations.md's metric table lists their names)."""
