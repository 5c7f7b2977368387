"""The spans attention backend inside a Scorer, scored against plain transformers one pair at a time.

On `cuda` this is the span kernel compiled for the GPU (block shapes, warps, the bfloat16-free float32
path with IEEE products); on `cpu` (CI) the same calls take the backend's dense fallback, which keeps
the constructor and the registry entry honest between GPU days. Log-probabilities are compared: the
label probabilities are ~1e-3 here, where an absolute tolerance would hide a 10 % error.
"""

from __future__ import annotations

import math
import random

import pytest

from kafka_scorer.wire.protocol import Job
from tests.cuda_tests.devices import DEVICES, on_cuda
from tests.engine.reference import reference_scores

LABELS = [3, 44]


def log_diff(got: list[list[float]], want: list[list[float]]) -> float:
    return max(abs(math.log(a) - math.log(b)) for ra, rb in zip(got, want) for a, b in zip(ra, rb))


def mis_jobs(rng: random.Random, count: int) -> list[Job]:
    """Queries of 1 to 150 tokens and items of 0 to 200: sequences of several 64-token tiles, tiles that
    straddle items and (several jobs in one forward) sequences."""

    def tokens(most: int, least: int = 0) -> list[int]:
        return [rng.randrange(5, 380) for _ in range(rng.randint(least, most))]

    return [
        Job(
            id=str(n),
            query=tokens(150, 1),
            items=[tokens(200) for _ in range(rng.randint(2, 7))],
            label_token_ids=LABELS,
            multi_item=True,
        )
        for n in range(count)
    ]


def check(scorer, path, jobs: list[Job], tolerance: float) -> None:
    assert scorer.describe().attention_backend == "spans"
    for job, result in zip(jobs, scorer.score_jobs(jobs)):
        assert result.error is None, result.error
        want = reference_scores(path, job.query, job.items, LABELS)
        assert log_diff(result.scores, want) <= tolerance, job.id


@pytest.mark.parametrize("device", DEVICES)
def test_spans_scores_mis_jobs_as_transformers(tiny_models, scorer_for, device) -> None:
    check(
        scorer_for("spans", device),
        tiny_models.get(),
        mis_jobs(random.Random(5), 6),
        1e-3 if on_cuda(device) else 1e-4,
    )


@pytest.mark.parametrize("device", DEVICES)
def test_spans_soft_caps_gemma2_in_the_kernel(tmp_path, device) -> None:
    """Gemma 2 with caps low enough to bend random weights' scores; its window (4,096) is longer than
    any sequence, so every layer runs the kernel on CUDA, soft cap included."""
    from kafka_scorer.checkpoints.tiny_models import build_tiny_model
    from kafka_scorer.engine.scorer import Scorer

    overrides = {
        "attn_logit_softcapping": 5.0,
        "final_logit_softcapping": 3.0,
        "sliding_window": 4096,
        "query_pre_attn_scalar": 16,
    }
    path = build_tiny_model(tmp_path / "gemma2", "gemma2", overrides=overrides)
    scorer = Scorer(str(path), dtype="float32", device=device, attention_backend="spans")
    check(scorer, path, mis_jobs(random.Random(6), 4), 1e-3 if on_cuda(device) else 1e-4)


CUDA_ONLY = [param for param in DEVICES if param.id == "cuda"]


@pytest.mark.parametrize("device", CUDA_ONLY)
@pytest.mark.parametrize(
    ("dim", "heads", "kv_heads", "dtype_name", "softcap"),
    [
        (128, 16, 8, "bfloat16", None),  # Qwen3's head dim
        (128, 16, 8, "float16", None),
        (256, 8, 4, "bfloat16", 1.5),  # Gemma 2's head dim, with its cap
        (64, 4, 1, "float32", None),
    ],
)
def test_compiled_kernel_on_sglangs_shape_matches_the_naive_attention(
    device, dim, heads, kv_heads, dtype_name, softcap
) -> None:
    """The kernel alone, compiled, in the 16-bit dtypes the engine serves (the GPU casts the
    probabilities to the values' dtype for the second product, which the interpreter tests cannot
    see): two jobs of SGLang's shape (query 120, 10 items of 180) and a short pair in one stream,
    against the naive float64 attention of tests/engine/test_attention.py on the same inputs. The
    16-bit tolerance allows the probabilities' rounding (2**-9 relative for bfloat16) summed over keys
    and the output's rounding."""
    import torch

    from kafka_scorer.engine.attention.registry import attend, prepare_attention
    from tests.engine.test_attention import layout_of, naive_attention

    dtype = getattr(torch, dtype_name)
    seqs = [(120, (180,) * 10), (120, (180,) * 10), (33, ())]
    total = sum(p + sum(items) for p, items in seqs)
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(n, total, dim, generator=gen).to(dtype) for n in (heads, kv_heads, kv_heads))
    scale = 1.5 / math.sqrt(dim)
    metadata = prepare_attention(layout_of(seqs), "spans", pin=True).to(torch.device(device))
    got = attend(q.to(device), k.to(device), v.to(device), metadata, scale, softcap).cpu()
    want = naive_attention(q, k, v, seqs, scale, softcap)
    assert got.dtype == dtype and torch.isfinite(got).all()
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2**-7, "atol": 2e-2}
    torch.testing.assert_close(got.double(), want, **tolerance)
