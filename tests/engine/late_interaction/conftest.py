from __future__ import annotations

import pytest

from kafka_scorer.engine.scorer import Scorer
from kafka_scorer.engine.scorers import open_scorer


@pytest.fixture(scope="session")
def tiny_colbert(tmp_path_factory):
    """Tiny random ColBERT checkpoints in PyLate's layout (checkpoints/tiny_colbert.py), one per options."""
    from kafka_scorer.checkpoints.tiny_colbert import build_tiny_colbert

    cache: dict[tuple, object] = {}

    def get(**options):
        key = tuple(sorted(options.items()))
        if key not in cache:
            cache[key] = build_tiny_colbert(tmp_path_factory.mktemp("tiny-colbert"), **options)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def colbert_scorer(tiny_colbert):
    """One float32 CPU scorer per (checkpoint options, scorer options); the embedding cache is off unless
    a test names `embedding_cache_mb`."""
    cache: dict[tuple, Scorer] = {}

    def get(checkpoint: dict | None = None, **options) -> Scorer:
        options.setdefault("embedding_cache_mb", 0)
        key = (tuple(sorted((checkpoint or {}).items())), tuple(sorted(options.items())))
        if key not in cache:
            path = tiny_colbert(**(checkpoint or {}))
            cache[key] = open_scorer(str(path), dtype="float32", device="cpu", **options)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def reference_encoder(tiny_colbert):
    """sentence-transformers' own ColBERT encoder (`MultiVectorEncoder`, which reads PyLate's layout)."""
    from sentence_transformers import MultiVectorEncoder

    cache: dict[tuple, object] = {}

    def get(**options):
        key = tuple(sorted(options.items()))
        if key not in cache:
            cache[key] = MultiVectorEncoder(str(tiny_colbert(**options)), device="cpu")
        return cache[key]

    return get
