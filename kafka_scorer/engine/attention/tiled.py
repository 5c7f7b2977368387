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
So a tile's result depends on its own rows and keys only. An encoder pair (bidirectional) is one
segment whose every tile visits all its blocks unmasked. A sliding window masks by distance inside a
segment (a window never bites a packed sequence, which preparation refuses when it is longer than the
window).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from kafka_scorer.engine.attention.dense import soft_cap
from kafka_scorer.engine.attention.layout import AttentionLayout, host, to_device

ROWS = 16
"""Query rows per tile: a short item (the many-items bench's 16 tokens) wastes little padding; the
sizes were picked by measurement (docs/performance.md, Deterministic mode)."""
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
    segment_len: int


@dataclass(frozen=True)
class TiledMetadata:
    """Per tile and per step a few numbers, O(tiles · steps): each step's key indices and mask are
    formed on the device from them ([tiles, ROWS, KEYS] at a time), never stored."""

    layout: AttentionLayout
    query_index: torch.Tensor
    """[N, ROWS] stream index of each tile's rows (padding repeats the tile's first row)."""
    real: torch.Tensor
    """[N, ROWS] True for real rows."""
    query_pos: torch.Tensor
    """[N, ROWS] each row's position in its segment."""
    positions: torch.Tensor
    """Stream index of each real row, in tile order."""
    block_start: torch.Tensor
    """[S, N] stream index of each step's first key per tile."""
    keys_in: torch.Tensor
    """[S, N] real keys of the step's block (0: a step the tile does not have)."""
    key_pos: torch.Tensor
    """[S, N] position of the step's first key in the tile's segment (own blocks)."""
    own: torch.Tensor
    """[S, N] True for a block of the tile's own segment (causal, windowed), False for shared keys."""
    backend: ClassVar[str] = "deterministic"

    @classmethod
    def build(cls, layout: AttentionLayout, pin: bool) -> TiledMetadata:
        tiles = [tile for segment in _segments(layout) for tile in _tiles(*segment)]
        column = lambda values: torch.tensor(values, dtype=torch.long).reshape(-1)  # noqa: E731
        start, count, offset = (column([getattr(t, f) for t in tiles]) for f in ("start", "rows", "offset"))
        shared_start, shared_len = column([t.shared[0] for t in tiles]), column([t.shared[1] for t in tiles])
        segment_start = column([t.segment_start for t in tiles])
        segment_len = column([t.segment_len for t in tiles])
        rows = torch.arange(ROWS)
        real = rows[None, :] < count[:, None]  # [N, ROWS]
        query_index = start[:, None] + torch.where(real, rows, 0)
        # each tile's key blocks in order: its shared keys' blocks, then its own run's up to its last row
        shared_blocks = -(-shared_len // KEYS)
        if layout.causal:
            own_end = offset + count
        else:  # an encoder pair sees itself whole; hidden keys (an "item" of its sequence) see only the rest
            own_end = torch.where(shared_len > 0, 0, segment_len)
            offset = offset + shared_len  # rows' positions in their sequence, where the shared keys count
        steps = int((shared_blocks + -(-own_end // KEYS)).max()) if tiles else 0
        step = torch.arange(steps)[:, None]  # [S, 1]
        own = step >= shared_blocks  # [S, N]
        first = torch.where(own, (step - shared_blocks) * KEYS, step * KEYS)
        keys_in = torch.where(own, own_end - first, shared_len - first).clamp(0, KEYS)
        block_start = torch.where(keys_in > 0, torch.where(own, segment_start, shared_start) + first, 0)
        return cls(
            layout,
            host(query_index, pin),
            host(real, pin),
            host((offset[:, None] + rows).to(torch.int32), pin),
            host(query_index.reshape(-1)[real.reshape(-1)], pin),
            host(block_start, pin),
            host(keys_in.to(torch.int32), pin),
            host(first.to(torch.int32), pin),
            host(own, pin),
        )

    def to(self, device: torch.device) -> TiledMetadata:
        return to_device(self, device)

    @property
    def tiles(self) -> tuple[torch.Tensor, ...]:
        """The per-tile tensors, in `_attend_tiles`'s order (tiles on dim 0, or dim 1 for per-step ones)."""
        return (
            self.query_index,
            self.real,
            self.query_pos,
            self.block_start,
            self.keys_in,
            self.key_pos,
            self.own,
        )


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
        _Tile(start + offset, min(ROWS, length - offset), offset, shared, start, length)
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
    causal = metadata.layout.causal
    parts = [
        _attend_tiles(q, k, v, chunk, scale, softcap, window, causal)
        for chunk in _tile_chunks(metadata, q.device.type == "cuda")
    ]
    real = metadata.real.reshape(-1)
    result = torch.cat(parts, dim=2).reshape(heads, -1, dim)[:, : real.shape[0]]
    out[:, metadata.positions] = result[:, real].to(q.dtype)
    return out


def _tile_chunks(metadata: TiledMetadata, fixed: bool) -> list[tuple[torch.Tensor, ...]]:
    """The tiles all at once on the CPU, whose batched matmuls and row reductions run each matrix and
    row alike whatever their count (measured). On CUDA a kernel's configuration may follow the batch's
    size, so tiles go by chunks of `CUDA_TILES`, the last padded with tiles that see nothing."""
    arrays = metadata.tiles
    if not fixed:
        return [arrays]
    tiles = arrays[0].shape[0]
    missing = -tiles % CUDA_TILES
    per_tile, per_step = arrays[:3], arrays[3:]
    if missing:
        per_tile = tuple(torch.cat([x, x.new_zeros((missing, *x.shape[1:]))]) for x in per_tile)
        per_step = tuple(torch.cat([x, x.new_zeros((x.shape[0], missing))], dim=1) for x in per_step)
    return [
        (
            *(x[first : first + CUDA_TILES] for x in per_tile),
            *(x[:, first : first + CUDA_TILES] for x in per_step),
        )
        for first in range(0, tiles + missing, CUDA_TILES)
    ]


def _step_mask(
    real: torch.Tensor,
    query_pos: torch.Tensor,
    keys_in: torch.Tensor,
    key_pos: torch.Tensor,
    own: torch.Tensor,
    causal: bool,
    window: int | None,
) -> torch.Tensor:
    """[N, ROWS, KEYS] True where a tile's row may attend to a key of this step's block."""
    keys = torch.arange(KEYS, device=real.device)
    allowed = (keys < keys_in[:, None])[:, None, :] & real[:, :, None]
    if causal or window is not None:
        # causal: own blocks only (a packed sequence is never longer than a window); bidirectional:
        # every block, the positions being the sequence's (see `TiledMetadata.build`)
        distance = query_pos[:, :, None] - (key_pos[:, None] + keys)[:, None, :]
        inside = torch.ones_like(allowed)
        if causal:
            inside &= distance >= 0
        if window is not None:
            inside &= (distance if causal else distance.abs()) < window
        allowed &= (~own[:, None, None] | inside) if causal else inside
    return allowed


def _attend_tiles(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    chunk: tuple[torch.Tensor, ...],
    scale: float,
    softcap: float | None,
    window: int | None,
    causal: bool,
) -> torch.Tensor:
    """The online softmax of some tiles over their key blocks: -> [Hkv, g, N·ROWS, d] float32."""
    query_index, real, query_pos, block_start, keys_in, key_pos, own = chunk
    heads, tokens, dim = q.shape
    kv_heads = k.shape[0]
    groups = heads // kv_heads
    tiles = query_index.shape[0]
    keys = torch.arange(KEYS, device=q.device)
    # [N·Hkv, g·ROWS, d]: one tile's query heads that share a kv head, as one matrix
    qt = q.view(kv_heads, groups, tokens, dim)[:, :, query_index].float()
    qt = qt.permute(2, 0, 1, 3, 4).reshape(tiles * kv_heads, groups * ROWS, dim)
    top = torch.full((tiles * kv_heads, groups * ROWS, 1), float("-inf"), device=q.device)
    norm = torch.zeros_like(top)
    acc = torch.zeros(tiles * kv_heads, groups * ROWS, dim, device=q.device)
    # token-major float32 keys and values, so each step gathers whole rows
    k_rows, v_rows = (x.float().transpose(0, 1).reshape(tokens, -1) for x in (k, v))
    for step in range(block_start.shape[0]):
        last = (keys_in[step].long() - 1).clamp(min=0)
        index = (block_start[step][:, None] + torch.minimum(keys, last[:, None])).reshape(-1)
        kb, vb = (
            x.index_select(0, index).view(tiles, KEYS, kv_heads, dim).transpose(1, 2).reshape(-1, KEYS, dim)
            for x in (k_rows, v_rows)
        )
        scores = torch.bmm(qt, kb.transpose(1, 2)) * scale
        if softcap is not None:
            scores = soft_cap(scores, softcap)
        allowed = _step_mask(real, query_pos, keys_in[step], key_pos[step], own[step], causal, window)
        scores = scores.view(tiles, kv_heads, groups, ROWS, KEYS)
        scores = scores.masked_fill(~allowed[:, None, None], float("-inf")).view(-1, groups * ROWS, KEYS)
        new_top = torch.maximum(top, scores.amax(-1, keepdim=True))
        safe = torch.where(new_top == float("-inf"), 0.0, new_top)
        probs = torch.exp(scores - safe)
        rescale = torch.exp(top - safe)
        norm = norm * rescale + probs.sum(-1, keepdim=True)
        acc = acc * rescale + torch.bmm(probs, vb)
        top = new_top
    # a row that sees no key (padding; a hidden ColBERT expansion token a window keeps from every key)
    # gets 0, as the dense path gives it; every other row's norm is at least 1, unchanged by the clamp
    norm = norm.clamp_min(torch.finfo(torch.float32).tiny)
    result = (acc / norm).view(tiles, kv_heads, groups, ROWS, dim).permute(1, 2, 0, 3, 4)
    return result.reshape(kv_heads, groups, tiles * ROWS, dim)
