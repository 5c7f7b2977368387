"""The flex backend: FlexAttention with a block-sparse mask, the CUDA path whose cost follows the mask.

The block mask is built on the packing thread from the layout's block lists (`BlockMask.from_kv_blocks`):
O(T) per-token ids for the mask rule plus BlockMask's `[q_blocks, kv_blocks]` block index, never a
`T × T` mask (`create_block_mask` evaluates the rule on every token pair: gigabytes at the model's
context length). Blocks wholly outside the SPEC §5 / §8 mask are never listed, so the kernel skips
them; the listed ones apply the rule.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from kafka_scorer.engine.attention.dense import DenseMetadata, OverDense, dense_attention
from kafka_scorer.engine.attention.layout import AttentionLayout, host

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask

BLOCK = 128  # FlexAttention's sparse block size (its default)


@dataclass(frozen=True)
class FlexMetadata(OverDense):
    """The block mask and the per-token ids its rule reads (the segment ids are the dense metadata's)."""

    documents: torch.Tensor
    """[T] int32: the sequence each token belongs to."""
    block_mask: BlockMask
    """Its `mask_mod` reads `documents` and `dense.segments` on the same device as the block index."""
    backend: ClassVar[str] = "flex"

    @classmethod
    def build(cls, layout: AttentionLayout, pin: bool) -> FlexMetadata:
        from torch.nn.attention.flex_attention import BlockMask

        dense = DenseMetadata.build(layout, pin)
        documents = torch.repeat_interleave(
            torch.arange(len(layout.seq_lens), dtype=torch.int32),
            torch.tensor(layout.seq_lens, dtype=torch.long),
        )
        documents = host(documents, pin)
        counts, indices = kv_blocks(layout)
        total = layout.total_tokens
        block_mask = BlockMask.from_kv_blocks(
            host(counts[None, None], pin),
            host(indices[None, None], pin),
            BLOCK_SIZE=BLOCK,
            mask_mod=_mask_rule(documents, dense.segments, layout.causal),
            seq_lengths=(total, total),
        )
        return cls(dense, documents, block_mask)

    def to(self, device: torch.device) -> FlexMetadata:
        """The mask rule closes over the per-token ids, so it is made again over the moved ones."""
        dense = self.dense.to(device)
        documents = self.documents.to(device, non_blocking=True)
        block_mask = self.block_mask.to(device)
        block_mask.mask_mod = _mask_rule(documents, dense.segments, self.layout.causal)
        return FlexMetadata(dense, documents, block_mask)


def _mask_rule(documents: torch.Tensor, segments: torch.Tensor, causal: bool) -> Callable:
    """SPEC §5 (a prefix token sees its prefix causally, an item token the prefix and its own item) or
    §8 (a pair's tokens see the whole pair), per token pair, for the blocks the index lists."""

    def allowed(batch, head, q_idx, kv_idx):
        same_item = (segments[kv_idx] == 0) | (segments[kv_idx] == segments[q_idx])
        return (documents[q_idx] == documents[kv_idx]) & (kv_idx <= q_idx) & same_item

    def bidirectional(batch, head, q_idx, kv_idx):
        return documents[q_idx] == documents[kv_idx]

    return allowed if causal else bidirectional


def kv_blocks(layout: AttentionLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """For each query block, the key blocks any of its tokens may see, from the segments it overlaps:
    a prefix token sees its sequence's prefix up to itself; an item token sees the prefix and its own
    item up to itself; an encoder token sees its whole pair. Work follows the segments, not the tokens.
    Returns the counts [q_blocks] and BlockMask's index [q_blocks, kv_blocks] (rows left-aligned)."""
    blocks = -(-layout.total_tokens // BLOCK)
    needed: list[set[int]] = [set() for _ in range(blocks)]

    def add(q_start: int, q_end: int, seen: tuple[tuple[int, int], ...], causal_from: int | None) -> None:
        """Queries [q_start, q_end) see the key ranges `seen`, and the keys from `causal_from` up to the
        query block's last token (None: none such)."""
        for qb in range(q_start // BLOCK, (q_end - 1) // BLOCK + 1):
            last_q = min(q_end, (qb + 1) * BLOCK)  # one past this block's last token of the segment
            ranges = seen if causal_from is None else (*seen, (causal_from, last_q))
            for lo, hi in ranges:
                if hi > lo:
                    needed[qb].update(range(lo // BLOCK, (hi - 1) // BLOCK + 1))

    for start, length, prefix, items in zip(
        layout.seq_starts, layout.seq_lens, layout.prefix_lens, layout.item_lens
    ):
        if length == 0:
            continue
        if not layout.causal:
            add(start, start + length, ((start, start + length),), None)
            continue
        if prefix:
            add(start, start + prefix, (), start)
        item_start = start + prefix
        for n in items:
            if n:
                add(item_start, item_start + n, ((start, start + prefix),), item_start)
            item_start += n
    counts = torch.tensor([len(b) for b in needed], dtype=torch.int32)
    indices = torch.zeros((blocks, blocks), dtype=torch.int32)
    for qb, kv in enumerate(needed):
        if kv:
            indices[qb, : len(kv)] = torch.tensor(sorted(kv), dtype=torch.int32)
    return counts, indices


@functools.cache
def _flex_kernel() -> Callable:
    """Compiled once per process on CUDA (the fused kernel); eager elsewhere, for correctness checks."""
    from torch.nn.attention.flex_attention import flex_attention

    if torch.cuda.is_available():
        return torch.compile(flex_attention, dynamic=True)
    return flex_attention


@functools.cache
def _soft_cap_score_mod(cap: float, device: torch.device) -> Callable:
    """One score_mod per cap value and device, so the compiled kernel is reused instead of retraced per
    layer. The cap rides in as a 0-d tensor on the scores' device, not a Python float: torch 2.15's
    flex traces a captured float as a symbolic float once it recompiles (another cap, another shape)
    and then refuses it (`... can only be of Tensor, int, SymInt but got SymFloat`); a tensor is a
    buffer it accepts on every torch from our floor up."""
    limit = torch.tensor(cap, dtype=torch.float32, device=device)

    def capped(score, batch, head, q_idx, kv_idx):
        return torch.tanh(score / limit) * limit

    return capped


def flex_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    metadata: FlexMetadata,
    scale: float,
    softcap: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """q [H, T, d], k/v [Hkv, T, d] -> [H, T, d] through the batch's block mask.

    Flex applies `scale` before the score_mod, so the cap sees the same scores as Gemma 2's eager code.
    """
    if window is not None and metadata.layout.longest > window:
        return dense_attention(q, k, v, metadata.dense, scale, softcap, window)
    out = _flex_kernel()(
        q[None],
        k[None],
        v[None],
        score_mod=None if softcap is None else _soft_cap_score_mod(softcap, q.device),
        block_mask=metadata.block_mask,
        scale=scale,
        enable_gqa=q.shape[0] != k.shape[0],
    )
    return out[0]
