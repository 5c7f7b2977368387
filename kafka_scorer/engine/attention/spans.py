"""The spans backend: a Triton flash-attention forward that walks each query tile's own key spans.

FlexAttention's block mask is square: a 128 × 128 block that touches two items is computed whole, so on
SGLang's MIS shape (query 120, 10 items of 180 tokens) flex computes about 2.5× the scores the mask
keeps. Here the queries are cut into tiles of `BLOCK_M` tokens, and each tile lists the exact key ranges
its tokens may see (SPEC §5): its sequences' prefixes up to the tile's last token and each overlapping
item's own tokens up to the tile's last token, merged where they touch. The kernel
(`engine/kernels/span_attention_triton.py`) loops over those spans in chunks of keys that start where a
span starts, not on a block grid, and applies the per-pair rule from per-token ids inside each chunk. So
a tile inside an item reads the prefix and its own item and nothing of any other item.

Its speed is unmeasured (it was written without a GPU): it is opt-in (`attention_backend="spans"`),
never chosen by `auto`. It leaves to the dense path what it does not cover: encoder (non-causal)
batches, a sliding window shorter than the longest sequence, and any device where the kernel cannot run
(the CPU, unless triton's interpreter is on: that is how the tests run the kernel without a GPU).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from itertools import accumulate
from typing import ClassVar

import torch

from kafka_scorer.engine.attention.dense import DenseMetadata, OverDense, dense_attention
from kafka_scorer.engine.attention.layout import AttentionLayout, host
from kafka_scorer.engine.kernels.runs_on import triton_runs_on

BLOCK_M = 64
"""Query tokens per tile (the kernel's BLOCK_M). Smaller than flex's 128 so that a tile that straddles
two items reads less of the one it mostly does not belong to; 64 rows still feed tl.dot well on an
H100. Unmeasured."""


@dataclass(frozen=True)
class SpanMetadata(OverDense):
    """Per tile, a CSR list of key spans; per token, the ids the kernel's mask rule reads (the segment
    ids are the dense metadata's). O(T + tiles + spans) entries, spans <= 2 per (sequence, tile) pair."""

    documents: torch.Tensor
    """[T] int32: the sequence each token belongs to (merged spans may cross a sequence boundary)."""
    span_offsets: torch.Tensor
    """[tiles + 1] int32: tile i's spans are `span_starts/ends[span_offsets[i]:span_offsets[i + 1]]`."""
    span_starts: torch.Tensor
    """[spans] int32: first key of each span (flat stream index)."""
    span_ends: torch.Tensor
    """[spans] int32: one past its last key."""
    block_m: int = BLOCK_M
    """Query tokens per tile; tests build smaller tiles to cross many tile edges in a short batch."""
    backend: ClassVar[str] = "spans"

    @classmethod
    def build(
        cls, layout: AttentionLayout, pin: bool, block_m: int = BLOCK_M, aligned: bool = False
    ) -> SpanMetadata:
        """`aligned`: each run's keys as spans of their own (`tile_spans`), deterministic mode's."""
        dense = DenseMetadata.build(layout, pin)
        documents = torch.repeat_interleave(
            torch.arange(len(layout.seq_lens), dtype=torch.int32),
            torch.tensor(layout.seq_lens, dtype=torch.long),
        )
        # An encoder batch goes to the dense path (`spans_attention`): it needs no spans.
        tiles = tile_spans(layout, block_m, aligned) if layout.causal else []
        offsets = [0, *accumulate(len(spans) for spans in tiles)]
        flat = [span for spans in tiles for span in spans]
        starts = torch.tensor([s for s, _ in flat], dtype=torch.int32)
        ends = torch.tensor([e for _, e in flat], dtype=torch.int32)
        return cls(
            dense,
            host(documents, pin),
            host(torch.tensor(offsets, dtype=torch.int32), pin),
            host(starts, pin),
            host(ends, pin),
            block_m,
        )


def tile_spans(layout: AttentionLayout, block: int, aligned: bool = False) -> list[list[tuple[int, int]]]:
    """For each tile of `block` query tokens, the sorted, disjoint key ranges `(start, end)` whose union
    is exactly the keys some token of the tile may see under SPEC §5.

    Per sequence the tile overlaps, with `last` one past the tile's last token of that sequence:
    - its prefix up to `last` (all of it when the tile reaches its items: an item token sees the whole
      prefix; a prefix token sees the prefix up to itself);
    - from the start of the first item the tile overlaps up to `last`: every item the tile overlaps
      lies in that range (the tile is contiguous), and each token of it is seen by that item's last
      token in the tile. Nothing of an item the tile does not overlap is listed.
    Ranges that touch are merged (one loop of key chunks instead of two).

    `aligned` (deterministic mode): every item the tile overlaps is a range of its own from its first
    token, the prefix one from the sequence's first token, and nothing is merged. The kernel cuts a
    range into key chunks from its start, so a token's keys then fall into the same chunks, visited in
    the same order, wherever its sequence sits in the stream and whatever shares its tile; a range a
    token may not see is masked whole, which leaves its running sums exactly as they were.
    Python work is O(sequences + items + tiles) (one bisect per (sequence, tile) pair), never O(T).
    """
    total = layout.total_tokens
    tiles: list[list[tuple[int, int]]] = [[] for _ in range(-(-total // block))]
    for start, length, prefix, items in zip(
        layout.seq_starts, layout.seq_lens, layout.prefix_lens, layout.item_lens
    ):
        if length == 0:
            continue
        end, items_start = start + length, start + prefix
        bounds = list(accumulate(items, initial=items_start))  # item k is [bounds[k], bounds[k + 1])
        for tile in range(start // block, (end - 1) // block + 1):
            first = max(start, tile * block)
            last = min(end, (tile + 1) * block)
            ranges = tiles[tile]
            if prefix:
                ranges.append((start, min(items_start, last)))
            if last > items_start:
                # bisect_right skips empty items (equal bounds): k is the item holding `first`'s token.
                k = bisect.bisect_right(bounds, max(first, items_start)) - 1
                if not aligned:
                    ranges.append((bounds[k], last))
                    continue
                while k < len(items) and bounds[k] < last:
                    ranges.append((bounds[k], min(bounds[k + 1], last)))
                    k += 1
    return [sorted(r for r in ranges if r[1] > r[0]) if aligned else _merged(ranges) for ranges in tiles]


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted ranges, those that overlap or touch joined: one loop of key chunks instead of two."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(r for r in ranges if r[1] > r[0]):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def spans_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    metadata: SpanMetadata,
    scale: float,
    softcap: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """q [H, T, d], k/v [Hkv, T, d] -> [H, T, d] by the span kernel; soft-capping (Gemma 2) is applied
    in the kernel. A window no shorter than the longest sequence changes nothing and is ignored."""
    layout = metadata.layout
    windowed = window is not None and layout.longest > window
    if not layout.causal or windowed or q.shape[1] == 0 or not triton_runs_on(q.device):
        return dense_attention(q, k, v, metadata.dense, scale, softcap, window)
    from kafka_scorer.engine.kernels.span_attention_triton import span_attention

    return span_attention(
        q,
        k,
        v,
        metadata.documents,
        metadata.dense.segments,
        metadata.span_offsets,
        metadata.span_starts,
        metadata.span_ends,
        scale,
        softcap,
        metadata.block_m,
    )
