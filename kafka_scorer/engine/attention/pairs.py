"""Encoder pairs under the cascade backend: each pair attends to all of itself, one padded SDPA call
per group of similar lengths (SPEC §8's block-diagonal bidirectional attention)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from kafka_scorer.engine.attention.dense import DenseMetadata, OverDense
from kafka_scorer.engine.attention.layout import AttentionLayout, bucket_by_length, host


@dataclass(frozen=True)
class PairGroup:
    """Encoder pairs of similar length, attended to in one padded SDPA call."""

    gather: torch.Tensor
    """[S*L] flat stream index of each padded slot (padding repeats the pair's last token)."""
    size: int
    length: int
    keys: torch.Tensor | None
    """[S, 1, 1, L] key mask hiding the padding; None when every pair of the group is L long."""
    valid: torch.Tensor
    """Rows of the padded [S*L] output that hold real tokens."""
    positions: torch.Tensor
    """Their flat positions in the stream."""


@dataclass(frozen=True)
class PairMetadata(OverDense):
    """The cascade backend's metadata for an encoder batch: O(T) indices in all."""

    groups: list[PairGroup]
    backend: ClassVar[str] = "cascade"

    @classmethod
    def build(cls, layout: AttentionLayout, pin: bool) -> PairMetadata:
        """Length buckets of an encoder batch, gathered row-wise (token-major), the cheap way on a CPU."""
        groups = []
        for group in bucket_by_length(list(zip(layout.seq_starts, layout.seq_lens))):
            longest = group[0][1]
            offsets = torch.arange(longest)
            lengths = torch.tensor([length for _, length in group])
            starts = torch.tensor([start for start, _ in group])
            gather = starts[:, None] + torch.minimum(offsets[None, :], lengths[:, None] - 1)
            real = offsets[None, :] < lengths[:, None]
            flat_real = real.reshape(-1)
            groups.append(
                PairGroup(
                    gather=host(gather.reshape(-1), pin),
                    size=len(group),
                    length=longest,
                    keys=None if bool(real.all()) else host(real[:, None, None, :], pin),
                    valid=host(flat_real.nonzero().squeeze(1), pin),
                    positions=host(gather.reshape(-1)[flat_real], pin),
                )
            )
        return cls(DenseMetadata.build(layout, pin), groups)


def pair_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, metadata: PairMetadata, scale: float
) -> torch.Tensor:
    """Encoder pairs, each attending to all of itself: one padded SDPA per length bucket.

    Tokens are gathered and scattered as whole rows of the token-major `[T, H·d]` layout the
    projections produced (`index_select` / `index_copy_`), which costs a fraction of indexing the
    head-major view; the result is token-major too, so the layer's reshape after attention is free.
    """
    heads, total, dim = q.shape
    kv_heads = k.shape[0]
    out = torch.empty(total, heads, dim, dtype=q.dtype, device=q.device)
    flat_out = out.view(total, heads * dim)
    rows_q, rows_k, rows_v = (x.transpose(0, 1).reshape(total, -1) for x in (q, k, v))
    for group in metadata.groups:
        s, length = group.size, group.length

        def take(rows: torch.Tensor, n: int, s=s, length=length, gather=group.gather) -> torch.Tensor:
            return rows.index_select(0, gather).view(s, length, n, dim).transpose(1, 2)

        attended = F.scaled_dot_product_attention(
            take(rows_q, heads),
            take(rows_k, kv_heads),
            take(rows_v, kv_heads),
            attn_mask=group.keys,
            scale=scale,
            enable_gqa=kv_heads != heads,
        )
        padded = attended.transpose(1, 2).reshape(s * length, heads * dim)
        flat_out.index_copy_(0, group.positions, padded.index_select(0, group.valid))
    return out.transpose(0, 1)
