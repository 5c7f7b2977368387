"""Deterministic mode on the device: 48 of 48 bit-identical, and the scores those of the CPU.

The situations are tests/engine/determinism.py's (batch-mates, position in the stream, a shared
sequence, a small budget, a scorer whose cache setting is on and has seen every head). On CUDA the
mode's fixed-shape blocks, attention (the span kernel over aligned spans, or the tiles) and heads run
eagerly (engine/load/deterministic.py); the `cpu` variant runs the same calls in CI, the `cuda` ones with
`./dev test -m cuda tests/cuda_tests`. Reference: the
same checkpoint on the CPU in the default engine, which the CPU suite checks against transformers.
The encoder kinds too: a ModernBERT cross-encoder (mean pooling by pair, one pair at a time on CUDA,
where `index_add_` adds in no fixed order; local windows) and a ColBERT model with its embedding cache
on, whose cached documents must give the scores a fresh scorer computes (measured before the mode
served them, on the CPU: 16 and 22 of 48).
"""

from __future__ import annotations

import pytest

from tests.cuda_tests.devices import DEVICES, on_cuda
from tests.engine.determinism import count_identical, jobs_and_mates


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("backend", ["auto", "deterministic"], ids=["mode-s-own", "tiles"])
def test_deterministic_scores_bit_identical_on_the_device(tiny_models, device, dtype, backend):
    """`auto`: the device's own attention for the mode (on CUDA the span kernel over aligned spans);
    `deterministic`: the tiles, its fallback (on the CPU covered by tests/engine/test_deterministic.py)."""
    from kafka_scorer.engine.scorer import Scorer

    if (dtype == "bfloat16" or backend != "auto") and not on_cuda(device):
        pytest.skip(
            "the CPU variant runs float32 with the CPU's own attention (tests/engine covers the rest)"
        )
    path = str(tiny_models.get())

    def make(**options) -> Scorer:
        return Scorer(
            path,
            dtype=dtype,
            device=device,
            deterministic=True,
            prefix_cache_mb=16,
            attention_backend=backend,
            **options,
        )

    if on_cuda(device):
        assert make().describe().attention_backend == (
            "deterministic-spans" if backend == "auto" else "deterministic"
        )
    same, total, differed, _ = count_identical(make, causal=True)
    assert (same, total) == (48, 48), differed
    if dtype != "float32":
        return
    jobs, _ = jobs_and_mates(causal=True)
    cpu = Scorer(path, dtype="float32", device="cpu", prefix_cache_mb=0)
    for got, want in zip(make().score_jobs(jobs), cpu.score_jobs(jobs)):
        diff = max(abs(a - b) for ra, rb in zip(got.scores, want.scores) for a, b in zip(ra, rb))
        assert diff <= 1e-4


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["modernbert-mean", "colbert"])
def test_deterministic_encoders_bit_identical_on_the_device(tmp_path, device, kind):
    from kafka_scorer.checkpoints.tiny_colbert import build_tiny_colbert
    from kafka_scorer.checkpoints.tiny_models import build_tiny_encoder
    from kafka_scorer.engine.scorer import Scorer

    if kind == "colbert":
        path, options = build_tiny_colbert(tmp_path / kind), {"embedding_cache_mb": 16}
    else:  # a position table long enough for the shared jobs' heads
        overrides = {"classifier_pooling": "mean", "max_position_embeddings": 700}
        path, options = build_tiny_encoder(tmp_path / kind, "modernbert", overrides=overrides), {}

    def make(**more):
        return Scorer(str(path), dtype="float32", device=device, deterministic=True, **options, **more)

    same, total, differed, _ = count_identical(make, causal=False, softmax=kind != "colbert")
    assert (same, total) == (48, 48), differed
