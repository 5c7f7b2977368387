"""The varlen backend's runs against the SPEC §5 mask written out in tests/engine/test_attention.py.

What is proved, for every generated layout: the runs' queries tile the stream once, in order; each
run's gathered keys under the kernel's lower-right causal rule (query i of n sees the first i + m - n + 1
of its m keys) allow exactly the (query, key) pairs the mask allows, so the kernel computes the scores
the mask keeps and no others; a batch of plain pairs reads its keys in place. That the backend's
outputs equal the naive attention is tests/engine/test_attention.py's (every backend, there); the
kernel itself on a GPU is tests/cuda_tests/test_varlen_cuda.py's.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings

from kafka_scorer.engine.attention.varlen import VarlenMetadata
from tests.engine.test_attention import layout_of, token_mask
from tests.engine.test_span_metadata import SEQUENCES


def allowed_by_runs(metadata: VarlenMetadata, total: int) -> torch.Tensor:
    """[T, T]: the pairs the kernel computes, from the metadata's tensors (not its host list)."""
    keys = metadata.key_index if metadata.key_index is not None else torch.arange(total)
    cu_q, cu_k = metadata.cu_q.tolist(), metadata.cu_k.tolist()
    allowed = torch.zeros(total, total, dtype=torch.bool)
    for r in range(len(cu_q) - 1):
        n, m = cu_q[r + 1] - cu_q[r], cu_k[r + 1] - cu_k[r]
        assert 0 < n <= m
        for i in range(n):
            allowed[cu_q[r] + i, keys[cu_k[r] : cu_k[r] + i + m - n + 1]] = True
    return allowed


@settings(max_examples=300, deadline=None)
@given(seqs=SEQUENCES)
def test_the_runs_compute_exactly_the_pairs_the_mask_allows(seqs) -> None:
    layout = layout_of(seqs)
    metadata = VarlenMetadata.build(layout, pin=False)
    total = layout.total_tokens
    assert metadata.cu_q.tolist()[-1] == total and metadata.cu_q.tolist()[0] == 0
    assert torch.equal(allowed_by_runs(metadata, total), token_mask(seqs, causal=True))
    assert metadata.max_q == max(b - a for a, b in zip(metadata.cu_q.tolist(), metadata.cu_q.tolist()[1:]))
    assert [r[:2] for r in metadata.runs] == list(zip(metadata.cu_q.tolist(), metadata.cu_q.tolist()[1:]))


def test_sglang_s_shape_gathers_the_query_once_per_item_and_pairs_read_in_place() -> None:
    seqs = [(120, (180,) * 10)] * 3
    metadata = VarlenMetadata.build(layout_of(seqs), pin=False)
    assert len(metadata.runs) == 3 * 11
    assert metadata.key_index is not None and metadata.key_index.numel() == 3 * (1920 + 120 * 10)
    assert (metadata.max_q, metadata.max_k) == (180, 300)
    pairs = VarlenMetadata.build(layout_of([(40, ()), (7, ()), (0, ()), (300, ())]), pin=False)
    assert pairs.key_index is None and pairs.cu_q.tolist() == [0, 40, 47, 347]


def test_a_stream_padded_past_the_layout_leaves_its_padding_rows_zero() -> None:
    """A forward padded to a CUDA graph's bucket: the real rows as unpadded, the rest 0."""
    from kafka_scorer.engine.attention.varlen import varlen_attention

    seqs = [(5, (3, 4)), (6, ())]
    layout = layout_of(seqs)
    metadata = VarlenMetadata.build(layout, pin=False)
    torch.manual_seed(3)
    q, k, v = torch.randn(4, 24, 8), torch.randn(2, 24, 8), torch.randn(2, 24, 8)
    padded = varlen_attention(q, k, v, metadata, 0.3)
    plain = varlen_attention(q[:, :18], k[:, :18], v[:, :18], metadata, 0.3)
    assert padded.shape == q.shape and torch.equal(padded[:, :18], plain)
    assert not padded[:, 18:].any()


def test_an_empty_stream_attends_to_nothing() -> None:
    from kafka_scorer.engine.attention.varlen import varlen_attention

    metadata = VarlenMetadata.build(layout_of([(0, ())]), pin=False)
    q, k, v = torch.randn(4, 3, 8), torch.randn(2, 3, 8), torch.randn(2, 3, 8)
    assert metadata.runs == [] and not varlen_attention(q, k, v, metadata, 0.3).any()
