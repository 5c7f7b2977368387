"""Both attention backends against a naive float64 attention with the SPEC §5 mask written out here."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kafka_scorer.engine.attention.layout import AttentionLayout
from kafka_scorer.engine.attention.registry import BACKENDS, attend, prepare_attention

LAYOUTS = [
    # (prefix_len, item_lens) per sequence; an empty tuple is a plain causal pair.
    [(7, ())],
    [(5, (3, 1, 4))],
    [(0, (2, 3))],
    [(4, (0, 2, 0))],
    [(3, ()), (6, (2, 2, 5)), (1, ()), (9, ()), (2, (1,)), (0, (4, 0, 1))],
]


def layout_of(seqs, causal: bool = True, sliding_window: int | None = None) -> AttentionLayout:
    """The layout of `(prefix_len, item_lens)` sequences packed one after another."""
    lens = [p + sum(items) for p, items in seqs]
    return AttentionLayout(
        seq_starts=[sum(lens[:i]) for i in range(len(lens))],
        seq_lens=lens,
        prefix_lens=[p for p, _ in seqs],
        item_lens=[items for _, items in seqs],
        sliding_window=sliding_window,
        causal=causal,
    )


def run_backend(backend, q, k, v, layout, scale, softcap=None, window=None):
    """One layer's attention through `backend`, its metadata built as the packing thread builds it."""
    return attend(q, k, v, prepare_attention(layout, backend), scale, softcap, window)


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
    got = run_backend(backend, q, k, v, layout_of(seqs), 0.3)
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
    got = run_backend(backend, q, k, v, layout_of([(n, ()) for n in lens], causal=False), 0.3, None, window)
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
def test_flex_over_many_blocks_matches_the_dense_backend(seqs, causal) -> None:
    """Over a batch of many blocks flex gives exactly the dense backend's masked attention (MIS causal,
    and encoder pairs bidirectional). On the CPU this checks the mask rule; the block lists are checked
    by the next test."""
    torch.manual_seed(2)
    if not causal:
        seqs = [(p + sum(items), ()) for p, items in seqs]
    total, dim = sum(p + sum(items) for p, items in seqs), 8
    q, k, v = torch.randn(4, total, dim), torch.randn(2, total, dim), torch.randn(2, total, dim)
    got = run_backend("flex", q, k, v, layout_of(seqs, causal), 0.3)
    want = run_backend("dense", q, k, v, layout_of(seqs, causal), 0.3)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


def token_mask(seqs, causal: bool) -> torch.Tensor:
    """[T, T] SPEC §5 / §8 mask of sequences packed one after another (True = may attend)."""
    doc, owner = [], []
    for index, (prefix, items) in enumerate(seqs):
        doc += [index] * (prefix + sum(items))
        owner += [0] * prefix + [k + 1 for k, n in enumerate(items) for _ in range(n)]
    doc, owner = torch.tensor(doc), torch.tensor(owner)
    mask = doc[:, None] == doc[None, :]
    if causal:
        q, kv = torch.arange(len(doc))[:, None], torch.arange(len(doc))[None, :]
        mask &= (kv <= q) & ((owner[None, :] == 0) | (owner[None, :] == owner[:, None]))
    return mask


@pytest.mark.parametrize("seqs", MANY_BLOCKS)
@pytest.mark.parametrize("causal", [True, False])
def test_flex_block_lists_are_exactly_the_blocks_the_mask_touches(seqs, causal) -> None:
    """On the CPU flex runs eagerly and applies only the mask rule, so the block lists the CUDA kernel
    follows are checked here: a block pair is listed iff some token pair in it may attend (a missing
    block would drop keys on the GPU, an extra one would waste its work)."""
    from kafka_scorer.engine.attention.flex import BLOCK, FlexMetadata

    if not causal:
        seqs = [(p + sum(items), ()) for p, items in seqs]
    mask = token_mask(seqs, causal)
    total = mask.shape[0]
    blocks = -(-total // BLOCK)
    padded = torch.zeros(blocks * BLOCK, blocks * BLOCK, dtype=torch.bool)
    padded[:total, :total] = mask
    touched = padded.view(blocks, BLOCK, blocks, BLOCK).any(dim=3).any(dim=1)
    block_mask = FlexMetadata.build(layout_of(seqs, causal), pin=False).block_mask
    counts, indices = block_mask.kv_num_blocks[0, 0], block_mask.kv_indices[0, 0]
    listed = torch.zeros(blocks, blocks, dtype=torch.bool)
    for row in range(blocks):
        listed[row, indices[row, : counts[row]].long()] = True
    assert torch.equal(listed, touched)


def metadata_tensors(value) -> dict[int, torch.Tensor]:
    """Every tensor a metadata object holds, by identity: its fields, lists, the BlockMask's block
    index and what its mask rule closes over."""
    from torch.nn.attention.flex_attention import BlockMask

    found: dict[int, torch.Tensor] = {}
    if isinstance(value, torch.Tensor):
        found[id(value)] = value
    elif isinstance(value, list | tuple):
        for item in value:
            found |= metadata_tensors(item)
    elif isinstance(value, BlockMask):
        names = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")
        names += ("q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")
        found |= metadata_tensors([getattr(value, name) for name in names])
        found |= metadata_tensors([cell.cell_contents for cell in value.mask_mod.__closure__ or ()])
    elif dataclasses.is_dataclass(value):
        found |= metadata_tensors([getattr(value, f.name) for f in dataclasses.fields(value)])
    return found


def test_flex_metadata_of_a_32k_token_batch_holds_no_token_pair_tensor() -> None:
    """SPEC's MIS layout at 32,768 tokens: the metadata holds O(T) per-token ids plus BlockMask's
    [q_blocks, kv_blocks] index (blocks = T / 128), and no tensor made while building it is larger; a
    T × T mask (a billion entries here) would be several gigabytes."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        numel = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, tuple | list) else [out]:
                if isinstance(t, torch.Tensor):
                    Largest.numel = max(Largest.numel, t.numel())
            return out

    seqs = [(512, tuple([31] * 32))] * 22 + [(2, (34,))]  # 22 jobs of 1,504 tokens + one of 36
    layout = layout_of(seqs)
    total = layout.total_tokens
    assert total == 33_124
    with Largest():
        metadata = prepare_attention(layout, "flex")
    blocks = -(-total // 128)
    assert Largest.numel <= max(total, (blocks + 1) ** 2)  # the index's transpose pads one column
    held = metadata_tensors(metadata)
    # documents and segments; counts and indices, and their transpose (q blocks)
    assert sum(t.numel() for t in held.values()) <= 2 * total + 2 * blocks * (blocks + 1)
    assert all(t.numel() <= max(total, blocks * blocks) for t in held.values())
    # and the mask is sparse where the layout is: a block of one job never lists another job's blocks
    assert int(metadata.block_mask.kv_num_blocks.max()) <= 2 * -(-1504 // 128)


@pytest.mark.parametrize(("backend", "per_token"), [("dense", 1), ("cascade", 5)])
def test_index_metadata_of_a_32k_token_batch_is_a_few_tensors_of_t_entries(backend, per_token) -> None:
    """The dense and cascade metadata of the same 32k-token MIS batch: segment ids, gather/scatter
    indices and item key masks of at most T entries each (an [n, I, I] item mask would be 20·T here)."""
    layout = layout_of([(512, tuple([31] * 32))] * 22 + [(2, (34,))])
    held = metadata_tensors(prepare_attention(layout, backend)).values()
    assert all(t.numel() <= layout.total_tokens for t in held)
    assert sum(t.numel() for t in held) <= per_token * layout.total_tokens


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("causal", [True, False])
def test_moving_the_metadata_moves_every_tensor_it_holds(backend, causal) -> None:
    """`.to(device)` leaves nothing behind, the tensors the flex mask rule closes over included (the
    `meta` device stands in for CUDA: a tensor left on the CPU would still say `cpu`)."""
    seqs = MANY_BLOCKS[0] if causal else [(p + sum(items), ()) for p, items in MANY_BLOCKS[0]]
    metadata = prepare_attention(layout_of(seqs, causal), backend)
    moved = metadata.to(torch.device("meta"))
    assert type(moved) is type(metadata) and moved.layout == metadata.layout
    tensors = metadata_tensors(moved).values()
    if backend == "segmented":  # plain numbers only: its calls slice the layer's own tensors
        assert not tensors and moved.calls == metadata.calls
        return
    assert tensors and all(t.device.type == "meta" for t in tensors)
