"""The spans backend's key spans against the SPEC §5 mask written out in tests/engine/test_attention.py.

What is proved, for every generated layout and tile size, tile by tile:
- the spans are sorted, non-empty and neither overlap nor touch (touching ones must have been merged);
- their union is exactly the tile's footprint, {k : some query q of the tile may attend to k}: so every
  (query, key) pair the mask allows lies inside a span of the query's tile (the kernel sees every key
  it must), and no spanned key is one that no query of the tile may see;
- the spans' total length is at most the sum, over the sequences the tile overlaps, of that sequence's
  prefix length plus the lengths of the items the tile overlaps: the work follows the mask, never the
  items a tile does not touch.
"""

from __future__ import annotations

import itertools
import math
import sys

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_scorer.engine.attention.spans import BLOCK_M, SpanMetadata, tile_spans
from tests.engine.test_attention import layout_of, metadata_tensors, token_mask

SEQUENCES = st.lists(
    st.tuples(st.integers(0, 20), st.lists(st.integers(0, 20), max_size=6).map(tuple)),
    min_size=1,
    max_size=6,
).filter(lambda seqs: sum(p + sum(items) for p, items in seqs) > 0)


def touched_work(seqs, lo: int, hi: int) -> int:
    """Σ over the sequences overlapping tokens [lo, hi) of (prefix + lengths of the items it overlaps),
    from the (prefix, items) list alone."""
    work, start = 0, 0
    for prefix, items in seqs:
        end = start + prefix + sum(items)
        if start < hi and lo < end:
            work += prefix
            item_start = start + prefix
            for n in items:
                if n and item_start < hi and lo < item_start + n:
                    work += n
                item_start += n
        start = end
    return work


def check_tiles(seqs, block: int) -> None:
    layout = layout_of(seqs)
    total = layout.total_tokens
    mask = token_mask(seqs, causal=True)
    tiles = tile_spans(layout, block)
    assert len(tiles) == math.ceil(total / block)
    for tile, spans in enumerate(tiles):
        lo, hi = tile * block, min(total, (tile + 1) * block)
        for (start, end), following in zip(spans, [*spans[1:], (total + 1, total + 1)]):
            assert 0 <= start < end < following[0], spans
        covered = torch.zeros(total, dtype=torch.bool)
        for start, end in spans:
            covered[start:end] = True
        footprint = mask[lo:hi].any(dim=0)
        assert torch.equal(covered, footprint), (tile, spans)
        assert sum(end - start for start, end in spans) <= touched_work(seqs, lo, hi)


@settings(max_examples=300, deadline=None)
@given(seqs=SEQUENCES, block=st.sampled_from([1, 3, 4, 16, BLOCK_M]))
def test_spans_are_exactly_each_tiles_footprint_of_the_mask(seqs, block) -> None:
    """Generated layouts: empty items, zero-length prefixes, plain pairs, tiles that cross sequence
    and item boundaries (blocks of 1 to 64 over sequences of up to 140 tokens)."""
    check_tiles(seqs, block)


def test_fixed_layouts_including_an_empty_sequence() -> None:
    """A sequence of no tokens (prefix 0, no items) lists nothing and shifts nothing."""
    for seqs in ([(0, ()), (5, (3, 0, 4))], [(120, (180,) * 10)], [(0, (64, 64)), (64, ())]):
        for block in (16, BLOCK_M):
            check_tiles(seqs, block)


def runs_of(seqs) -> list[tuple[int, int]]:
    """Each token's run: (its sequence, 0 for the prefix or k + 1 for item k)."""
    return [
        (index, owner)
        for index, (prefix, items) in enumerate(seqs)
        for owner in [0] * prefix + [k + 1 for k, n in enumerate(items) for _ in range(n)]
    ]


def check_aligned_tiles(seqs, block: int) -> None:
    """Deterministic mode's spans: sorted and disjoint (they may touch), their union the tile's footprint,
    and each one run of tokens (a prefix or one item) from that run's first token: the kernel's key
    chunks then start where the token's own runs start, wherever the sequence sits in the stream."""
    layout = layout_of(seqs)
    total = layout.total_tokens
    mask, runs = token_mask(seqs, causal=True), runs_of(seqs)
    tiles = tile_spans(layout, block, aligned=True)
    assert len(tiles) == math.ceil(total / block)
    for tile, spans in enumerate(tiles):
        lo, hi = tile * block, min(total, (tile + 1) * block)
        for (start, end), following in zip(spans, [*spans[1:], (total, total + 1)]):
            assert 0 <= start < end <= following[0], spans
            assert len(set(runs[start:end])) == 1, (tile, spans)
            assert start == 0 or runs[start - 1] != runs[start], (tile, spans)
        covered = torch.zeros(total, dtype=torch.bool)
        for start, end in spans:
            covered[start:end] = True
        assert torch.equal(covered, mask[lo:hi].any(dim=0)), (tile, spans)


@settings(max_examples=300, deadline=None)
@given(seqs=SEQUENCES, block=st.sampled_from([1, 3, 4, 16, BLOCK_M]))
def test_aligned_spans_are_the_footprint_cut_at_every_run_s_first_token(seqs, block) -> None:
    check_aligned_tiles(seqs, block)


def test_aligned_spans_of_sglang_s_shape_start_at_the_query_and_each_item() -> None:
    """One sequence, query 120 and 10 items of 180 (item k is [120 + 180k, 300 + 180k)): the 64-row tile
    640..703 ends item 2 and starts item 3, and lists the query, item 2 from its first token and item 3
    from its own; merged spans read items 2 and 3 as one range from item 2's start, so item 3's keys
    would be chunked from another token than in a tile of item 3 alone."""
    layout = layout_of([(120, (180,) * 10)])
    assert tile_spans(layout, BLOCK_M, aligned=True)[10] == [(0, 120), (480, 660), (660, 704)]
    assert tile_spans(layout, BLOCK_M)[10] == [(0, 120), (480, 704)]
    assert tile_spans(layout, BLOCK_M, aligned=True)[11] == [(0, 120), (660, 768)]


def test_metadata_holds_the_spans_as_csr_and_each_tokens_sequence() -> None:
    seqs = [(3, ()), (6, (2, 2, 5)), (1, ()), (9, ()), (2, (1,)), (0, (4, 0, 1))]
    layout = layout_of(seqs)
    metadata = SpanMetadata.build(layout, pin=False, block_m=16)
    offsets = metadata.span_offsets.tolist()
    flat = list(zip(metadata.span_starts.tolist(), metadata.span_ends.tolist()))
    assert [flat[a:b] for a, b in itertools.pairwise(offsets)] == tile_spans(layout, 16)
    documents = [i for i, (p, items) in enumerate(seqs) for _ in range(p + sum(items))]
    assert metadata.documents.tolist() == documents
    assert all(t.dtype == torch.int32 for t in metadata_tensors(metadata).values())


def test_sglang_shape_computes_fewer_scores_than_flex_blocks() -> None:
    """SGLang's benchmark shape (query 120, 10 items of 180), one sequence: counted, not timed. Tiles
    of 64 queries over their spans in chunks of 64 keys compute 1.46x the pairs the mask keeps (1.29x
    with exact chunk ends; the rest of the excess is each tile's causal diagonal and the tiles that
    straddle two items); flex's listed 128 x 128 blocks compute 1.91x on this one sequence."""
    from kafka_scorer.engine.attention.flex import BLOCK, kv_blocks

    seqs = [(120, (180,) * 10)]
    layout = layout_of(seqs)
    kept = int(token_mask(seqs, causal=True).sum())
    computed = sum(
        BLOCK_M * sum(-(-(end - start) // 64) * 64 for start, end in spans)
        for spans in tile_spans(layout, BLOCK_M)
    )
    flex = int(kv_blocks(layout)[0].sum()) * BLOCK * BLOCK
    assert computed <= 1.5 * kept, computed / kept
    assert computed <= 0.8 * flex, (computed / kept, flex / kept)


def test_metadata_of_a_32k_token_batch_is_linear_in_tokens_and_tiles() -> None:
    """The 32k-token MIS batch of test_attention.py: per-token ids (documents, segments) and at most two
    spans per (sequence, tile) pair, nothing quadratic."""
    seqs = [(512, tuple([31] * 32))] * 22 + [(2, (34,))]
    layout = layout_of(seqs)
    metadata = SpanMetadata.build(layout, pin=False)
    tiles = math.ceil(layout.total_tokens / BLOCK_M)
    assert metadata.span_offsets.numel() == tiles + 1
    assert metadata.span_starts.numel() <= 2 * (tiles + len(seqs))
    held = metadata_tensors(metadata).values()
    assert sum(t.numel() for t in held) <= 2 * layout.total_tokens + 5 * (tiles + len(seqs)) + 1


def test_off_cuda_the_backend_takes_the_dense_path_without_importing_triton(monkeypatch) -> None:
    """The CPU runs the kernel only under triton's interpreter; a CPU command that marked triton absent
    (cli/no_triton.py) gets the dense path even for CUDA-typed checks, and nothing imports triton."""
    from kafka_scorer.engine.kernels.runs_on import triton_runs_on as kernel_runs_on

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    had_triton = "triton" in sys.modules
    assert not kernel_runs_on(torch.device("cpu"))
    assert ("triton" in sys.modules) == had_triton
    monkeypatch.setitem(sys.modules, "triton", None)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not kernel_runs_on(torch.device("cpu"))
    assert not kernel_runs_on(torch.device("cuda"))
