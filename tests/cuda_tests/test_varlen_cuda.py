"""The varlen backend: FlashAttention-2's variable-length kernel as torch ships it, on the runs of
`engine/attention/varlen.py`.

On `cuda` the kernel alone runs in the 16-bit dtypes it takes (grouped-query heads, runs with more
keys than queries, whose causal rule must be the lower-right one) against the naive float64 attention;
and a Scorer on the backend scores MIS jobs as transformers does one pair at a time (float32 there
runs the runs through `reference_varlen`, the kernel's contract in torch). On `cpu` (CI) the same
Scorer calls take the reference path, which keeps the registry entry and the constructor honest.
"""

from __future__ import annotations

import math
import random

import pytest

from tests.cuda_tests.devices import DEVICES, on_cuda
from tests.cuda_tests.test_spans_cuda import LABELS, log_diff, mis_jobs
from tests.engine.reference import reference_scores

CUDA_ONLY = [param for param in DEVICES if param.id == "cuda"]


@pytest.mark.parametrize("device", CUDA_ONLY)
@pytest.mark.parametrize(
    ("dim", "heads", "kv_heads", "dtype_name"),
    [
        (128, 16, 8, "bfloat16"),  # Qwen3-0.6B's heads
        (128, 16, 8, "float16"),
        (64, 8, 1, "bfloat16"),
    ],
)
def test_flash_runs_on_sglangs_shape_match_the_naive_attention(
    device, dim, heads, kv_heads, dtype_name
) -> None:
    """Two jobs of SGLang's shape (query 120, 10 items of 180), a job without a query, an empty item and
    a short pair in one stream; the 16-bit tolerance is the span kernel's (test_spans_cuda.py)."""
    import torch

    from kafka_scorer.engine.attention.registry import attend, prepare_attention
    from kafka_scorer.engine.kernels.flash_varlen import flash_runs_on
    from tests.engine.test_attention import layout_of, naive_attention

    dtype = getattr(torch, dtype_name)
    seqs = [(120, (180,) * 10), (0, (50, 7)), (120, (180, 0, 3) * 3), (33, ())]
    total = sum(p + sum(items) for p, items in seqs)
    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(n, total, dim, generator=gen).to(dtype) for n in (heads, kv_heads, kv_heads))
    scale = 1.5 / math.sqrt(dim)
    metadata = prepare_attention(layout_of(seqs), "varlen", pin=True).to(torch.device(device))
    assert flash_runs_on(q.to(device).transpose(0, 1))
    got = attend(q.to(device), k.to(device), v.to(device), metadata, scale).cpu()
    want = naive_attention(q, k, v, seqs, scale)
    assert got.dtype == dtype and torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, rtol=2**-7, atol=2e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_scores_mis_jobs_as_transformers(tiny_models, scorer_for, device) -> None:
    scorer = scorer_for("varlen", device)
    assert scorer.describe().attention_backend == "varlen"
    jobs = mis_jobs(random.Random(8), 5 if on_cuda(device) else 3)
    path = tiny_models.get()
    for job, result in zip(jobs, scorer.score_jobs(jobs)):
        assert result.error is None, result.error
        want = reference_scores(path, job.query, job.items, LABELS)
        assert log_diff(result.scores, want) <= (1e-3 if on_cuda(device) else 1e-4), job.id
