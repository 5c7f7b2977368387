"""The GPU tier: every test here runs once per device, `cpu` in CI and `cuda` where a GPU is.

The `cuda` variants (marked `cuda`) are what only the compiler and the device can get wrong (compiled
FlexAttention, the autotuned Triton kernel, pinned packing, the device thread feeding a GPU); run them
on a machine with CUDA with

    ./dev test -m cuda tests/cuda_tests            # or: ./dev gpu-check (the tier and the GPU benches)

Elsewhere they are skipped with that reason. The `cpu` variants run the very same code, with small job
counts, in CI: an API change (a constructor, a signature) then fails CI, not the next day a GPU is lent.
"""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(
        reason="needs a CUDA device: run `./dev test -m cuda tests/cuda_tests` on a GPU machine"
    )
    for item in items:
        # The marker, not `item.keywords`: every item of this folder has the keyword "cuda" (its package).
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def scorer_for(tiny_models):
    """One float32 Scorer per (arch, kind, backend, device): float32 so scores compare at CPU tolerances."""
    from kafka_scorer.engine.scorer import Scorer

    cache: dict[tuple, Scorer] = {}

    def get(backend: str, device: str, kind: str = "causal", arch: str = "qwen3") -> Scorer:
        key = (arch, kind, backend, device)
        if key not in cache:
            path = tiny_models.get(arch, kind)
            cache[key] = Scorer(str(path), dtype="float32", device=device, attention_backend=backend)
        return cache[key]

    return get
