"""The CUDA tier: tests that only a GPU can run (compiled FlexAttention, the autotuned Triton kernel,
pinned packing on the pack thread). Run them on a machine with CUDA with

    ./dev test -m cuda tests/cuda

Everywhere else they are skipped with that reason: the CPU suite covers the same code through the
eager / interpreter paths, and these exist for what only the compiler and the device can get wrong.
"""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(
        reason="needs a CUDA device: run `./dev test -m cuda tests/cuda` on a GPU machine"
    )
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def cuda_scorer_for(tiny_models):
    """One float32 CUDA Scorer per (arch, kind, backend): float32 so scores compare at CPU tolerances."""
    from kafka_scorer.engine.scorer import Scorer

    cache: dict[tuple, Scorer] = {}

    def get(backend: str, kind: str = "causal", device: str = "cuda", arch: str = "qwen3") -> Scorer:
        key = (arch, kind, backend, device)
        if key not in cache:
            path = tiny_models.get(arch, kind)
            cache[key] = Scorer(str(path), dtype="float32", device=device, attention_backend=backend)
        return cache[key]

    return get
