from __future__ import annotations

import pytest


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
