from __future__ import annotations

import pytest

from kafka_scorer.engine.scorer import Scorer


@pytest.fixture(scope="session")
def scorer_for(tiny_models):
    """One Scorer per (arch, kind, num_labels, options), float32 on the CPU, loaded like a real checkpoint."""
    cache: dict[tuple, Scorer] = {}

    def get(arch: str = "qwen3", kind: str = "causal", num_labels: int = 2, **options) -> Scorer:
        key = (arch, kind, num_labels, tuple(sorted(options.items())))
        if key not in cache:
            path = tiny_models.get(arch, kind, num_labels)
            cache[key] = Scorer(str(path), dtype="float32", device="cpu", **options)
        return cache[key]

    return get
