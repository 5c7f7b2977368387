from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_vl(tmp_path_factory):
    """A tiny random Qwen3-VL reranker on disk (checkpoints/tiny_vision.py), built once per session."""
    from kafka_scorer.checkpoints.tiny_vision import build_tiny_vl_reranker

    return build_tiny_vl_reranker(tmp_path_factory.mktemp("tiny-vl"))


@pytest.fixture(scope="session")
def vision_scorer(tiny_vl):
    """One float32 CPU scorer per options, opened the way the worker opens any checkpoint."""
    from kafka_scorer.engine.scorer import Scorer

    cache: dict[tuple, object] = {}

    def get(**options):
        key = tuple(sorted(options.items()))
        if key not in cache:
            cache[key] = Scorer(str(tiny_vl), dtype="float32", device="cpu", **options)
        return cache[key]

    return get
