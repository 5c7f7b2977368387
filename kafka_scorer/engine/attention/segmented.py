"""Deterministic mode's attention on the CPU: one fused SDPA call per causal run, shaped by that run alone.

A kernel's arithmetic for a row follows from the call's shapes (its blocking, the GEMMs it picks), so
a token's attention is batch-invariant when its call holds nothing but its own run: a *segment* is a
plain pair, a packed sequence's query, or one item, whose call takes the sequence's query keys (its
*shared* keys) and then its own. The call is the same wherever the sequence sits in the stream and
whatever else the forward holds, so its bits are too. An encoder pair is one bidirectional call; a
ColBERT query's hidden expansion tokens (an "item" of a bidirectional sequence) see the query's other
tokens only and are keys for nobody, as in the dense path.

Measured on the CPU, one thread, cpu-small's heads (8 × 64, 4 kv heads), the tiled backend
(`tiled.py`) against this one, attention alone: rerank 255 → 87 ms, many-items 239 → 138 ms, SGLang's
shape 451 → 113 ms, 64 plain pairs 144 → 47 ms (the cascade, not batch-invariant: 53, 62, 90, 33 ms).
On CUDA a call per item would launch thousands of kernels per layer, so deterministic mode keeps the
tiles there (`engine/deterministic.py` picks by device).

Per-layer variations arrive with the call: a window (only a plain pair or a bidirectional sequence
longer than it is ever windowed, as in the dense path) becomes a mask over the run's sequence indices;
a soft cap forms the scores explicitly (`dense.capped_attention`), still one call per segment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from kafka_scorer.engine.attention.dense import capped_attention
from kafka_scorer.engine.attention.layout import AttentionLayout, to_device


@dataclass(frozen=True)
class SegmentCall:
    """One segment's attention call: its query rows and the key runs they see, in order."""

    query: tuple[int, int]
    """(stream start, rows)."""
    keys: tuple[tuple[int, int], ...]
    """(stream start, length) of each key run: the shared keys first, then the segment's own."""
    offsets: tuple[int, ...]
    """Index in the sequence of the query's first row, then of each key run's first key (windows)."""
    mask: torch.Tensor | None
    """[rows, keys] True = may attend, for an item (all shared keys, its own causally); None: causal
    over itself (decoders) or every key (encoders)."""


@dataclass(frozen=True)
class SegmentedMetadata:
    """The calls of one forward, O(segments); masks shared between items of one (shared, own) shape."""

    layout: AttentionLayout
    calls: list[SegmentCall]
    backend: ClassVar[str] = "segmented"

    @classmethod
    def build(cls, layout: AttentionLayout, pin: bool = False) -> SegmentedMetadata:
        masks: dict[tuple[int, int], torch.Tensor] = {}

        def item_mask(shared: int, rows: int) -> torch.Tensor:
            if (shared, rows) not in masks:
                masks[shared, rows] = torch.ones(rows, shared + rows, dtype=torch.bool).tril(shared)
            return masks[shared, rows]

        calls = []
        for start, length, prefix, items in zip(
            layout.seq_starts, layout.seq_lens, layout.prefix_lens, layout.item_lens
        ):
            own = prefix if items else length  # a plain pair is one run
            if own:
                calls.append(SegmentCall((start, own), ((start, own),), (0, 0), None))
            offset = prefix
            for rows in items:
                if rows and layout.causal:
                    runs = ((start, prefix), (start + offset, rows))
                    mask = item_mask(prefix, rows)
                    calls.append(SegmentCall((start + offset, rows), runs, (offset, 0, offset), mask))
                elif rows:  # hidden keys: they see the sequence's other tokens only
                    calls.append(SegmentCall((start + offset, rows), ((start, prefix),), (offset, 0), None))
                offset += rows
        return cls(layout, calls)

    def to(self, device: torch.device) -> SegmentedMetadata:
        return to_device(self, device)


def segmented_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    metadata: SegmentedMetadata,
    scale: float,
    softcap: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """q [H, T, d], k/v [Hkv, T, d] -> [H, T, d]; rows outside the layout (stream padding) are 0."""
    out = torch.zeros_like(q)
    causal = metadata.layout.causal
    gqa = q.shape[0] != k.shape[0]
    for call in metadata.calls:
        start, rows = call.query
        qs = q[:, start : start + rows]
        if len(call.keys) == 1:
            first, length = call.keys[0]
            ks, vs = k[:, first : first + length], v[:, first : first + length]
        else:
            ks, vs = (torch.cat([x[:, s : s + n] for s, n in call.keys], dim=1) for x in (k, v))
        mask = _with_window(call, window, causal, q.device)
        own = mask is None and causal  # a run over itself: SDPA's causal flag
        if softcap is not None:
            full = mask if mask is not None else _plain_mask(rows, ks.shape[1], own, q.device)
            result = capped_attention(qs[None], ks[None], vs[None], full, scale, softcap)[0].to(q.dtype)
        else:
            result = F.scaled_dot_product_attention(
                qs, ks, vs, attn_mask=mask, is_causal=own, scale=scale, enable_gqa=gqa
            )
        out[:, start : start + rows] = result
    return out


def _plain_mask(rows: int, keys: int, causal: bool, device: torch.device) -> torch.Tensor:
    full = torch.ones(rows, keys, dtype=torch.bool, device=device)
    return full.tril() if causal else full


def _with_window(
    call: SegmentCall, window: int | None, causal: bool, device: torch.device
) -> torch.Tensor | None:
    """The call's mask with the window applied where the dense path applies it: a run over itself (a
    plain pair, or any bidirectional segment) whose keys reach further than the window."""
    rows = call.query[1]
    keys = sum(n for _, n in call.keys)
    if window is None or (causal and call.mask is not None):
        return call.mask
    q_pos = call.offsets[0] + torch.arange(rows, device=device)
    k_pos = torch.cat([o + torch.arange(n, device=device) for o, (_, n) in zip(call.offsets[1:], call.keys)])
    distance = q_pos[:, None] - k_pos[None, :]
    if int(distance.abs().max()) < window:
        return call.mask
    inside = (distance.abs() < window) & (distance >= 0 if causal else True)
    base = call.mask if call.mask is not None else _plain_mask(rows, keys, causal, device)
    return base & inside
