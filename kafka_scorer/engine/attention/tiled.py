"""The deterministic backend: every token's attention computed by the same arithmetic wherever it sits.

The other backends group and pad by the batch's shape (the cascade buckets prefixes of similar length,
pads items to the longest of their sequence; the fused kernels pick block sizes from the padded
length), so a token's result changes in the last bits with its batch-mates. Here the blocking depends
only on the token's own sequence:

- a *segment* is a causal run of tokens: a plain pair, a packed sequence's query, or one of its items
  (which also sees its sequence's whole query, its *shared* keys);
- each segment is cut into query tiles of `BLOCK` rows aligned at the segment's start, and each tile
  visits its keys in `BLOCK`-key blocks in one fixed order: the shared keys' blocks (aligned at the
  sequence's start), then its own segment's blocks up to its diagonal (causal mask);
- all tiles advance together, one key block per step, by an online softmax in float32 whose every
  matmul has the same shape ([g·BLOCK, d] × [d, BLOCK], batched over tiles). A tile with fewer blocks
  gets fully masked steps at the end, which change nothing exactly (max unchanged, scale exp(0) = 1,
  added terms 0).
So a tile's result depends on its own rows and keys only. Encoders (bidirectional pairs) are not
covered; a sliding window masks by distance inside a segment (a window never bites a packed sequence,
which preparation refuses when it is longer than the window).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from kafka_scorer.engine.attention.dense import soft_cap
from kafka_scorer.engine.attention.layout import AttentionLayout, host, to_device

BLOCK = 32


@dataclass(frozen=True)
class _Tile:
    start: int
    """Stream index of the tile's first row."""
    rows: int
    """Real rows (the rest of the BLOCK are padding)."""
    offset: int
    """Position of the tile's first row in its segment."""
    shared: tuple[int, int]
    """(stream start, length) of the keys every row sees whole; (0, 0) for none."""
    segment_start: int


@dataclass(frozen=True)
class TiledMetadata:
    layout: AttentionLayout
    query_index: torch.Tensor
    """[N, BLOCK] stream index of each tile's rows (padding repeats the tile's first row)."""
    query_valid: torch.Tensor
    """[N·BLOCK] True for real rows."""
    positions: torch.Tensor
    """Stream index of each real row, in tile order."""
    key_index: torch.Tensor
    """[S, N, BLOCK] stream index of each step's keys per tile."""
    allowed: torch.Tensor
    """[S, N, BLOCK, BLOCK] True where a tile's row may attend to the step's key."""
    distance: torch.Tensor
    """[S, N, BLOCK, BLOCK] int32 query position minus key position in the segment (for windows)."""
    backend: ClassVar[str] = "deterministic"

    @classmethod
    def build(cls, layout: AttentionLayout, pin: bool) -> TiledMetadata:
        if not layout.causal:
            raise ValueError("deterministic attention covers causal decoders only, not encoder pairs")
        tiles = [tile for segment in _segments(layout) for tile in _tiles(*segment)]
        plans = [_key_blocks(tile) for tile in tiles]
        steps = max((len(plan) for plan in plans), default=0)
        offsets = torch.arange(BLOCK)
        query_index = torch.tensor([[t.start] * BLOCK for t in tiles], dtype=torch.long).reshape(-1, BLOCK)
        real = torch.tensor([[r < t.rows for r in range(BLOCK)] for t in tiles], dtype=torch.bool)
        query_index = torch.where(real, query_index + offsets, query_index)
        key_index = torch.zeros(steps, len(tiles), BLOCK, dtype=torch.long)
        allowed = torch.zeros(steps, len(tiles), BLOCK, BLOCK, dtype=torch.bool)
        distance = torch.zeros(steps, len(tiles), BLOCK, BLOCK, dtype=torch.int32)
        for n, (tile, plan) in enumerate(zip(tiles, plans)):
            q_pos = tile.offset + offsets
            for step, (start, count, first_pos, causal) in enumerate(plan):
                k_pos = first_pos + offsets
                key_index[step, n] = start + offsets.clamp(max=max(count - 1, 0))
                ok = (offsets < count)[None, :] & real[n][:, None]
                if causal:
                    ok &= k_pos[None, :] <= q_pos[:, None]
                allowed[step, n] = ok
                distance[step, n] = (q_pos[:, None] - k_pos[None, :]).to(torch.int32) if causal else 0
        valid = real.reshape(-1)
        positions = query_index.reshape(-1)[valid]
        return cls(
            layout,
            host(query_index, pin),
            host(valid, pin),
            host(positions, pin),
            host(key_index, pin),
            host(allowed, pin),
            host(distance, pin),
        )

    def to(self, device: torch.device) -> TiledMetadata:
        return to_device(self, device)


def _segments(layout: AttentionLayout) -> list[tuple[int, int, tuple[int, int]]]:
    """(stream start, length, shared keys) of every causal run in the stream."""
    out = []
    for start, length, prefix, items in zip(
        layout.seq_starts, layout.seq_lens, layout.prefix_lens, layout.item_lens
    ):
        if not items:
            out.append((start, length, (0, 0)))
            continue
        if prefix:
            out.append((start, prefix, (0, 0)))
        item_start = start + prefix
        for n in items:
            if n:
                out.append((item_start, n, (start, prefix)))
            item_start += n
    return out


def _tiles(start: int, length: int, shared: tuple[int, int]) -> list[_Tile]:
    return [
        _Tile(start + offset, min(BLOCK, length - offset), offset, shared, start)
        for offset in range(0, length, BLOCK)
    ]


def _key_blocks(tile: _Tile) -> list[tuple[int, int, int, bool]]:
    """(stream start, keys, first key's position in the segment, causal) of each key block, in order."""
    shared_start, shared_len = tile.shared
    blocks = [
        (shared_start + b, min(BLOCK, shared_len - b), -shared_len + b, False)
        for b in range(0, shared_len, BLOCK)
    ]
    own_end = tile.offset + tile.rows
    blocks += [
        (tile.segment_start + b, min(BLOCK, own_end - b), b, True) for b in range(0, tile.offset + 1, BLOCK)
    ]
    return blocks


def tiled_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    metadata: TiledMetadata,
    scale: float,
    softcap: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """q [H, T, d], k/v [Hkv, T, d] -> [H, T, d]; rows outside the layout (stream padding) are 0."""
    heads, tokens, dim = q.shape
    kv_heads = k.shape[0]
    groups = heads // kv_heads
    tiles = metadata.query_index.shape[0]
    out = torch.zeros_like(q)
    if tiles == 0:
        return out
    # [N·Hkv, g·B, d]: one tile's query heads that share a kv head, as one matrix
    qt = q.view(kv_heads, groups, tokens, dim)[:, :, metadata.query_index].float()
    qt = qt.permute(2, 0, 1, 3, 4).reshape(tiles * kv_heads, groups * BLOCK, dim)
    top = torch.full((tiles * kv_heads, groups * BLOCK, 1), float("-inf"), device=q.device)
    norm = torch.zeros_like(top)
    acc = torch.zeros(tiles * kv_heads, groups * BLOCK, dim, device=q.device)
    for step in range(metadata.key_index.shape[0]):
        index = metadata.key_index[step]
        kb = k[:, index].float().permute(1, 0, 2, 3).reshape(tiles * kv_heads, BLOCK, dim)
        vb = v[:, index].float().permute(1, 0, 2, 3).reshape(tiles * kv_heads, BLOCK, dim)
        scores = torch.bmm(qt, kb.transpose(1, 2)) * scale
        if softcap is not None:
            scores = soft_cap(scores, softcap)
        allowed = metadata.allowed[step]
        if window is not None:
            allowed = allowed & (metadata.distance[step] < window)
        scores = scores.view(tiles, kv_heads, groups, BLOCK, BLOCK)
        scores = scores.masked_fill(~allowed[:, None, None], float("-inf")).view(-1, groups * BLOCK, BLOCK)
        new_top = torch.maximum(top, scores.amax(-1, keepdim=True))
        safe = torch.where(new_top == float("-inf"), 0.0, new_top)
        probs = torch.exp(scores - safe)
        rescale = torch.exp(top - safe)
        norm = norm * rescale + probs.sum(-1, keepdim=True)
        acc = acc * rescale + torch.bmm(probs, vb)
        top = new_top
    result = (acc / norm).view(tiles, kv_heads, groups, BLOCK, dim).permute(1, 2, 0, 3, 4)
    result = result.reshape(heads, tiles * BLOCK, dim)
    out[:, metadata.positions] = result[:, metadata.query_valid].to(q.dtype)
    return out
