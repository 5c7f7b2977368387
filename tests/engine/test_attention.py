"""Both attention backends against a naive float64 attention with the SPEC §5 mask written out here."""

from __future__ import annotations

import pytest
import torch

from kafka_scorer.engine.attention import BACKENDS, AttentionLayout

LAYOUTS = [
    # (prefix_len, item_lens) per sequence; an empty tuple is a plain causal pair.
    [(7, ())],
    [(5, (3, 1, 4))],
    [(0, (2, 3))],
    [(4, (0, 2, 0))],
    [(3, ()), (6, (2, 2, 5)), (1, ()), (9, ()), (2, (1,)), (0, (4, 0, 1))],
]


def layout_of(seqs, backend: str, causal: bool = True) -> AttentionLayout:
    """The layout of `(prefix_len, item_lens)` sequences packed one after another, on the CPU."""
    lens = [p + sum(items) for p, items in seqs]
    return AttentionLayout(
        seq_starts=[sum(lens[:i]) for i in range(len(lens))],
        seq_lens=lens,
        prefix_lens=[p for p, _ in seqs],
        item_lens=[items for _, items in seqs],
        device=torch.device("cpu"),
        backend=backend,
        causal=causal,
    )


def naive_attention(q, k, v, seqs, scale, cap=None, window=None):
    """float64, one query row at a time; `cap` soft-caps the scores before the mask (Gemma 2), `window`
    keeps the last `window` keys."""
    heads, kv_heads = q.shape[0], k.shape[0]
    k = k.repeat_interleave(heads // kv_heads, dim=0).double()
    v = v.repeat_interleave(heads // kv_heads, dim=0).double()
    out = torch.zeros_like(q, dtype=torch.float64)
    start = 0
    for prefix, items in seqs:
        owner = [0] * prefix + [i + 1 for i, n in enumerate(items) for _ in range(n)]
        length = len(owner)
        for i in range(length):
            keys = [j for j in range(i + 1) if owner[j] == 0 or owner[j] == owner[i]]
            keys = [j for j in keys if window is None or i - j < window]
            idx = torch.tensor([start + j for j in keys])
            scores = (q[:, start + i].double()[:, None, :] * k[:, idx]).sum(-1) * scale
            if cap is not None:
                scores = cap * torch.tanh(scores / cap)
            out[:, start + i] = (torch.softmax(scores, -1)[:, :, None] * v[:, idx]).sum(1)
        start += length
    return out


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("seqs", LAYOUTS)
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (4, 2), (6, 1)])
def test_backend_matches_naive_mask(backend, seqs, heads, kv_heads):
    torch.manual_seed(0)
    total, dim = sum(p + sum(items) for p, items in seqs), 8
    q = torch.randn(heads, total, dim)
    k = torch.randn(kv_heads, total, dim)
    v = torch.randn(kv_heads, total, dim)
    layout = layout_of(seqs, backend)
    got = BACKENDS[backend](q, k, v, layout, 0.3)
    want = naive_attention(q, k, v, seqs, 0.3)
    assert got.shape == q.shape
    assert torch.allclose(got.double(), want, atol=1e-5), (got.double() - want).abs().max()


def naive_bidirectional(q, k, v, lens, scale, window=None):
    """float64: each token of a pair sees every token of that pair (within `window`: |i - j| < window)."""
    heads, kv_heads = q.shape[0], k.shape[0]
    k = k.repeat_interleave(heads // kv_heads, dim=0).double()
    v = v.repeat_interleave(heads // kv_heads, dim=0).double()
    out = torch.zeros_like(q, dtype=torch.float64)
    start = 0
    for length in lens:
        for i in range(length):
            idx = torch.tensor([start + j for j in range(length) if window is None or abs(i - j) < window])
            scores = (q[:, start + i].double()[:, None, :] * k[:, idx]).sum(-1) * scale
            out[:, start + i] = (torch.softmax(scores, -1)[:, :, None] * v[:, idx]).sum(1)
        start += length
    return out


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("lens", [[7], [5, 5, 5], [1, 9, 3, 3, 12, 2, 8, 8, 1]])
@pytest.mark.parametrize(("heads", "kv_heads", "window"), [(4, 4, None), (4, 2, None), (4, 4, 3)])
def test_encoder_layout_is_block_diagonal_and_bidirectional(backend, lens, heads, kv_heads, window):
    """SPEC §8: plain pairs of unequal length (one length bucket pads them), no causal mask, and the
    symmetric window of ModernBERT's local layers."""
    torch.manual_seed(1)
    total, dim = sum(lens), 8
    q, k, v = (
        torch.randn(heads, total, dim),
        torch.randn(kv_heads, total, dim),
        torch.randn(kv_heads, total, dim),
    )
    layout = layout_of([(n, ()) for n in lens], backend, causal=False)
    got = BACKENDS[backend](q, k, v, layout, 0.3, None, window)
    assert got.shape == q.shape
    want = naive_bidirectional(q, k, v, lens, 0.3, window)
    assert torch.allclose(got.double(), want, atol=1e-5), (got.double() - want).abs().max()


MANY_BLOCKS = [
    # (prefix_len, item_lens) per sequence, spanning many 128-token blocks: long prefixes, items that
    # straddle block edges, short sequences sharing a block, an item of one token and empty ones.
    [(300, (90, 1, 0, 140, 33)), (5, ()), (17, (64, 64)), (260, ()), (0, (129, 2)), (130, (0, 127, 1))],
]


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("seqs", MANY_BLOCKS)
@pytest.mark.parametrize("causal", [True, False])
def test_flex_block_lists_over_many_blocks_match_the_dense_mask(seqs, causal) -> None:
    """The flex block mask is built from block lists, not from the token pairs: over a batch of many
    blocks it must still give exactly the dense backend's masked attention (MIS causal, and encoder
    pairs bidirectional)."""
    torch.manual_seed(2)
    if not causal:
        seqs = [(p + sum(items), ()) for p, items in seqs]
    total, dim = sum(p + sum(items) for p, items in seqs), 8
    q, k, v = torch.randn(4, total, dim), torch.randn(2, total, dim), torch.randn(2, total, dim)
    got = BACKENDS["flex"](q, k, v, layout_of(seqs, "flex", causal), 0.3)
    want = BACKENDS["dense"](q, k, v, layout_of(seqs, "dense", causal), 0.3)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


def test_flex_metadata_of_a_32k_token_batch_holds_no_token_pair_tensor() -> None:
    """SPEC's MIS layout at 32,768 tokens: every tensor made while the block mask is built is O(T) or
    O(blocks²); a T × T mask (a billion entries here) would be several gigabytes."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from kafka_scorer.engine.attention import _flex_block_mask

    class Largest(TorchDispatchMode):
        numel = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, tuple | list) else [out]:
                if isinstance(t, torch.Tensor):
                    Largest.numel = max(Largest.numel, t.numel())
            return out

    seqs = [(512, tuple([31] * 32))] * 22 + [(2, (34,))]  # 22 jobs of 1,504 tokens + one of 36
    layout = layout_of(seqs, "flex")
    total = layout.total_tokens
    assert total == 33_124
    with Largest():
        mask = _flex_block_mask(layout)
    blocks = -(-total // 128)
    assert Largest.numel <= max(total, (blocks + 1) ** 2)  # the index pads one column
    # and the mask is sparse where the layout is: a block of one job never lists another job's blocks
    assert int(mask.kv_num_blocks.max()) <= 2 * -(-1504 // 128)
