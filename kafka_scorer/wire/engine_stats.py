"""The engine's counters as the worker reads them for /metrics: one typed call, `Engine.stats()`.

The counters live in the engine (its prefix cache, a late-interaction engine's document embedding
cache, its CUDA graphs); the worker reads them at each scrape (worker/cache_metrics.py). They cross
the seam as plain integers by name, so the worker imports no torch and no engine type, and it asks
for them through the seam's one method instead of by attribute names it would have to know.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

Counters = Mapping[str, int]
"""One part's counters and gauges by name (the field names of the engine's stats dataclass)."""


@dataclass(frozen=True, slots=True)
class EngineStats:
    """The engine's counters at one moment. None: the engine has no such part (the cache is off, the
    kind has none, no graphs were captured, a test's fake): nothing of it is exported."""

    prefix_cache: Counters | None = None
    embedding_cache: Counters | None = None
    cuda_graphs: Counters | None = None


def counters(stats: object | None) -> Counters | None:
    """An engine stats dataclass (or None) as plain counters."""
    if stats is None:
        return None
    assert dataclasses.is_dataclass(stats) and not isinstance(stats, type)
    return {name: int(value) for name, value in dataclasses.asdict(stats).items()}
