"""The delta rule's chunk follows the run's length (`engine/recurrent/gated_delta.py`, `chunk_size`).

Runs that fit one 64-token chunk take one chunk of the next power of two, so MIS items and short
pairs stop paying for padding; the scores must be what transformers' own 64-token chunking gives, and
longer runs must keep 64 (their chunk boundaries shape the sums)."""

from __future__ import annotations

import pytest
import torch

from kafka_scorer.engine.recurrent.gated_delta import CHUNK, chunk_size


def _rule():
    module = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    return module.torch_chunk_gated_delta_rule


@pytest.mark.parametrize("length", [1, 2, 3, 5, 16, 17, 32, 33, 64])
def test_a_run_that_fits_one_chunk_scores_as_with_transformers_chunk(length: int) -> None:
    rule = _rule()
    generator = torch.Generator().manual_seed(length)
    rows, heads, key_dim, value_dim = 3, 2, 16, 8
    q, k = (torch.randn(rows, length, heads, key_dim, generator=generator) for _ in range(2))
    v = torch.randn(rows, length, heads, value_dim, generator=generator)
    g = -torch.rand(rows, length, heads, generator=generator)
    beta = torch.rand(rows, length, heads, generator=generator)
    start = torch.randn(rows, heads, key_dim, value_dim, generator=generator) * 0.1
    common = dict(g=g, beta=beta, initial_state=start, output_final_state=True, use_qk_l2norm_in_kernel=True)
    sized, sized_state = rule(q, k, v, chunk_size=chunk_size(length), **common)
    whole, whole_state = rule(q, k, v, chunk_size=CHUNK, **common)
    assert chunk_size(length) < CHUNK or length > CHUNK // 2
    torch.testing.assert_close(sized, whole, rtol=0, atol=1e-6)
    torch.testing.assert_close(sized_state, whole_state, rtol=0, atol=1e-6)


@pytest.mark.parametrize("length", [65, 100, 640])
def test_longer_runs_keep_transformers_chunk(length: int) -> None:
    assert chunk_size(length) == CHUNK
