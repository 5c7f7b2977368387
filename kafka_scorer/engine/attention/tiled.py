"""The deterministic backend: every token's attention computed by the same arithmetic wherever it sits.

The other backends group and pad by the batch's shape (the cascade buckets prefixes of similar length,
pads items to the longest of their sequence; the fused kernels pick block sizes from the padded
length), so a token's result changes in the last bits with its batch-mates. Here the blocking depends
only on the token's own sequence:

- a *segment* is a causal run of tokens: a plain pair, a packed sequence's query, or one of its items
  (which also sees its sequence's whole query, its *shared* keys);
- each segment is cut into query tiles of `ROWS` rows aligned at the segment's start, and each tile
  visits its keys in `KEYS`-key blocks in one fixed order: the shared keys' blocks (aligned at the
  sequence's start), then its own segment's blocks up to its diagonal (causal mask);
- all tiles advance together, one key block per step, by an online softmax in float32 whose every
  matmul has the same shape ([g·ROWS, d] × [d, KEYS], batched over tiles). A tile with fewer blocks
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

ROWS = 16
"""Query rows per tile: short items (a rerank's 16-token documents) waste little padding."""
KEYS = 32
"""Keys per block."""
CUDA_TILES = 64
"""Tiles per batched call on CUDA (see `_tile_chunks`)."""


@dataclass(frozen=True)
class _Tile:
    start: int
    """Stream index of the tile's first row."""
    rows: int
    """Real rows (the rest of the tile's `ROWS` are padding)."""
    offset: int
    """Position of the tile's first row in its segment."""
    shared: tuple[int, int]
    """(stream start, length) of the keys every row sees whole; (0, 0) for none."""
    segment_start: int


@dataclass(frozen=True)
class TiledMetadata:
    layout: AttentionLayout
    query_index: torch.Tensor
    """[N, ROWS] stream index of each tile's rows (padding repeats the tile's first row)."""
    query_valid: torch.Tensor
    """[N·ROWS] True for real rows."""
    positions: torch.Tensor
    """Stream index of each real row, in tile order."""
    key_index: torch.Tensor
    """[S, N, KEYS] stream index of each step's keys per tile."""
    allowed: torch.Tensor
    """[S, N, ROWS, KEYS] True where a tile's row may attend to the step's key."""
    distance: torch.Tensor
    """[S, N, ROWS, KEYS] int32 query position minus key position in the segment (for windows)."""
    backend: ClassVar[str] = "deterministic"

    @classmethod
    def build(cls, layout: AttentionLayout, pin: bool) -> TiledMetadata:
        if not layout.causal:
            raise ValueError("deterministic attention covers causal decoders only, not encoder pairs")
        tiles = [tile for segment in _segments(layout) for tile in _tiles(*segment)]
        column = lambda values: torch.tensor(values, dtype=torch.long).reshape(-1)  # noqa: E731
        start, count, offset = (column([getattr(t, f) for t in tiles]) for f in ("start", "rows", "offset"))
        shared_start, shared_len = column([t.shared[0] for t in tiles]), column([t.shared[1] for t in tiles])
        segment_start = column([t.segment_start for t in tiles])
        rows, keys = torch.arange(ROWS), torch.arange(KEYS)
        real = rows[None, :] < count[:, None]  # [N, ROWS]
        query_index = start[:, None] + torch.where(real, rows, 0)
        q_pos = offset[:, None] + rows  # [N, ROWS] position in the segment
        # each tile's key blocks in order: its shared keys' blocks, then its own run's up to its last row
        shared_blocks = -(-shared_len // KEYS)
        own_end = offset + count
        steps = int((shared_blocks + -(-own_end // KEYS)).max()) if tiles else 0
        step = torch.arange(steps)[:, None]  # [S, 1]
        own = step >= shared_blocks  # [S, N]
        first = torch.where(own, (step - shared_blocks) * KEYS, step * KEYS)
        keys_in = torch.where(own, own_end - first, shared_len - first).clamp(0, KEYS)
        block_start = torch.where(keys_in > 0, torch.where(own, segment_start, shared_start) + first, 0)
        key_index = block_start[..., None] + torch.minimum(keys, (keys_in - 1).clamp(min=0)[..., None])
        k_pos = first[..., None] + keys  # [S, N, KEYS] (own blocks: position in the segment)
        causal = k_pos[:, :, None, :] <= q_pos[None, :, :, None]  # [S, N, ROWS, KEYS]
        allowed = (keys < keys_in[..., None])[:, :, None, :] & real[None, :, :, None]
        allowed &= ~own[..., None, None] | causal
        distance = torch.where(own[..., None, None], q_pos[None, :, :, None] - k_pos[:, :, None, :], 0)
        valid = real.reshape(-1)
        return cls(
            layout,
            host(query_index, pin),
            host(valid, pin),
            host(query_index.reshape(-1)[valid], pin),
            host(key_index, pin),
            host(allowed, pin),
            host(distance.to(torch.int32), pin),
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
        _Tile(start + offset, min(ROWS, length - offset), offset, shared, start)
        for offset in range(0, length, ROWS)
    ]


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
    heads, _, dim = q.shape
    out = torch.zeros_like(q)
    if metadata.query_index.shape[0] == 0:
        return out
    parts = [
        _attend_tiles(q, k, v, *arrays, scale, softcap, window)
        for arrays in _tile_chunks(metadata, q.device.type == "cuda")
    ]
    result = torch.cat(parts, dim=2).reshape(heads, -1, dim)[:, : metadata.query_valid.shape[0]]
    out[:, metadata.positions] = result[:, metadata.query_valid].to(q.dtype)
    return out


def _tile_chunks(metadata: TiledMetadata, fixed: bool) -> list[tuple[torch.Tensor, ...]]:
    """(query_index, key_index, allowed, distance) of the tiles, all at once on the CPU, whose batched
    matmuls and row reductions run each matrix and row alike whatever their count (measured). On CUDA a
    kernel's configuration may follow the batch's size, so tiles go by chunks of `CUDA_TILES`, the last
    padded with tiles that see nothing (dropped rows)."""
    arrays = (metadata.query_index, metadata.key_index, metadata.allowed, metadata.distance)
    if not fixed:
        return [arrays]
    tiles = arrays[0].shape[0]
    missing = -tiles % CUDA_TILES
    if missing:
        arrays = (
            torch.cat([arrays[0], arrays[0][:1].expand(missing, -1)]),
            *(torch.cat([x, x.new_zeros((x.shape[0], missing, *x.shape[2:]))], dim=1) for x in arrays[1:]),
        )
    return [
        (arrays[0][start : start + CUDA_TILES], *(x[:, start : start + CUDA_TILES] for x in arrays[1:]))
        for start in range(0, tiles + missing, CUDA_TILES)
    ]


def _attend_tiles(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    query_index: torch.Tensor,
    key_index: torch.Tensor,
    allowed_steps: torch.Tensor,
    distance: torch.Tensor,
    scale: float,
    softcap: float | None,
    window: int | None,
) -> torch.Tensor:
    """The online softmax of some tiles over their key blocks: -> [Hkv, g, N·ROWS, d] float32."""
    heads, tokens, dim = q.shape
    kv_heads = k.shape[0]
    groups = heads // kv_heads
    tiles = query_index.shape[0]
    # [N·Hkv, g·ROWS, d]: one tile's query heads that share a kv head, as one matrix
    qt = q.view(kv_heads, groups, tokens, dim)[:, :, query_index].float()
    qt = qt.permute(2, 0, 1, 3, 4).reshape(tiles * kv_heads, groups * ROWS, dim)
    top = torch.full((tiles * kv_heads, groups * ROWS, 1), float("-inf"), device=q.device)
    norm = torch.zeros_like(top)
    acc = torch.zeros(tiles * kv_heads, groups * ROWS, dim, device=q.device)
    # token-major float32 keys and values, so each step gathers whole rows
    k_rows, v_rows = (x.float().transpose(0, 1).reshape(tokens, -1) for x in (k, v))
    for step in range(key_index.shape[0]):
        index = key_index[step].reshape(-1)
        kb, vb = (
            x.index_select(0, index).view(tiles, KEYS, kv_heads, dim).transpose(1, 2).reshape(-1, KEYS, dim)
            for x in (k_rows, v_rows)
        )
        scores = torch.bmm(qt, kb.transpose(1, 2)) * scale
        if softcap is not None:
            scores = soft_cap(scores, softcap)
        allowed = allowed_steps[step]
        if window is not None:
            allowed = allowed & (distance[step] < window)
        scores = scores.view(tiles, kv_heads, groups, ROWS, KEYS)
        scores = scores.masked_fill(~allowed[:, None, None], float("-inf")).view(-1, groups * ROWS, KEYS)
        new_top = torch.maximum(top, scores.amax(-1, keepdim=True))
        safe = torch.where(new_top == float("-inf"), 0.0, new_top)
        probs = torch.exp(scores - safe)
        rescale = torch.exp(top - safe)
        norm = norm * rescale + probs.sum(-1, keepdim=True)
        acc = acc * rescale + torch.bmm(probs, vb)
        top = new_top
    result = (acc / norm).view(tiles, kv_heads, groups, ROWS, dim).permute(1, 2, 0, 3, 4)
    return result.reshape(kv_heads, groups, tiles * ROWS, dim)
