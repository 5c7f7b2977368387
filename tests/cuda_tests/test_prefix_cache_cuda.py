"""The prefix cache on CUDA: compiled FlexAttention (or the span kernel) for the front, cached prefixes on
the device.

Reference: the same checkpoint and jobs scored on the CPU with the cache off (which the CPU suite checks
against plain transformers, tests/engine/test_prefix_cache.py). The `cpu` variant runs the same calls in
CI (flex eagerly there); the `cuda` one with `./dev test -m cuda tests/cuda_tests` where a GPU is.
"""

from __future__ import annotations

import random

import pytest

from kafka_scorer.wire.protocol import Job
from tests.cuda_tests.devices import DEVICES


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["flex", "cascade", "dense", "spans", "varlen"])
def test_cached_scores_on_the_device_equal_the_cpu_without_a_cache(tiny_models, backend, device):
    from kafka_scorer.engine.scorer import Scorer

    path = str(tiny_models.get())
    cached = Scorer(path, dtype="float32", device=device, attention_backend=backend, prefix_cache_mb=16)
    cpu = Scorer(path, dtype="float32", device="cpu", attention_backend="dense", prefix_cache_mb=0)
    rng = random.Random(3)
    queries = [[rng.randrange(5, 380) for _ in range(rng.randint(150, 400))] for _ in range(4)]
    for round_ in range(3):
        jobs = [
            Job(
                id=f"{round_}-{n}",
                query=queries[rng.randrange(4)],
                items=[
                    [rng.randrange(5, 380) for _ in range(rng.randint(0, 60))]
                    for _ in range(rng.randint(1, 6))
                ],
                label_token_ids=[3, 44],
                multi_item=[None, False, True][n % 3],
            )
            for n in range(8)
        ]
        for got, want in zip(cached.score_jobs(jobs), cpu.score_jobs(jobs)):
            assert got.error is None and want.error is None
            diff = max(abs(a - b) for ra, rb in zip(got.scores, want.scores) for a, b in zip(ra, rb))
            assert diff <= 1e-4
            assert got.prompt_tokens + got.cached_tokens == want.prompt_tokens
    stats = cached.describe().prefix_cache
    assert stats is not None and stats.hits > 0 and stats.bytes > 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["flex", "cascade"])
def test_a_query_extended_from_a_cached_head_on_the_device(tiny_models, tmp_path, backend, device):
    """A repeated query after its template's head is cached is extended from the head's entry on the
    device (engine/attention/cached.py `extends`); scores equal the CPU without a cache."""
    from kafka_scorer.engine.scorer import Scorer

    file = tmp_path / "judge.txt"
    file.write_text("a rubric to judge by, rule after rule; " * 6 + "{instruction}\nQ: {query}\nA: {item}")
    path = str(tiny_models.get())
    options = dict(dtype="float32", template=str(file))
    gpu = Scorer(path, device=device, attention_backend=backend, prefix_cache_mb=16, **options)
    cpu = Scorer(path, device="cpu", attention_backend="dense", prefix_cache_mb=0, **options)
    jobs = [
        Job(id=f"other-{n}", query=f"another question {n}?", items=["x"], label_token_ids=[3, 44])
        for n in range(2)
    ]
    jobs += [
        Job(
            id=f"again-{n}", query="what boils at sea level?", items=["water", "oil"], label_token_ids=[3, 44]
        )
        for n in range(4)
    ]
    for job in jobs:
        (got,), (want,) = gpu.score_jobs([job]), cpu.score_jobs([job])
        diff = max(abs(a - b) for ra, rb in zip(got.scores, want.scores) for a, b in zip(ra, rb))
        assert diff <= 1e-4 and got.prompt_tokens + got.cached_tokens == want.prompt_tokens
    whole = cpu.engine.prepare(jobs[-1], "p").prefix_marks[0]
    assert got.cached_tokens == whole
