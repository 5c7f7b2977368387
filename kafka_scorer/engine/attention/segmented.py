"""Deterministic mode's attention on the CPU: fused SDPA calls shaped by one causal run alone.

A kernel's arithmetic for a row follows from the call's shapes (its blocking, the GEMMs it picks), so
a token's attention is batch-invariant when its calls hold nothing but its own run: a *segment* is a
plain pair, a packed sequence's query, or one item, which sees the sequence's query (its *shared*
keys) and then itself. A segment over itself is one flash call (causal for decoders, whole for an
encoder pair); an item is two, its shared keys and its own causally, merged by their log-sum-exps
(as the cascade merges, `cascade._merge`), so the query's keys are expanded to the query heads once
per sequence, never copied per item. The calls are the same wherever the sequence sits in the stream
and whatever else the forward holds, so their bits are too. A ColBERT query's hidden expansion tokens
(an "item" of a bidirectional sequence) see the query's other tokens only and are keys for nobody, as
in the dense path.

Measured on the CPU (`python -m kafka_scorer.bench.attention`: cpu-small's heads, one thread, float32),
ms per call against the tiled backend (`tiled.py`) and the cascade (not batch-invariant): rerank 62
vs 199 and 61, many-items 84 vs 316 and 63, SGLang's shape 82 vs 427 and 90, plain pairs 29 vs 138 and
33. On CUDA a call per item would launch thousands of kernels per layer, so deterministic mode keeps
the tiles there (`engine/deterministic.py`).

Per-layer variations arrive with the call: a window (only a plain pair or a bidirectional segment
longer than it is ever windowed, as in the dense path) and a soft cap (Gemma 2) take one explicit,
masked call per segment over its keys in order (`dense.capped_attention` for the cap).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from kafka_scorer.engine.attention.dense import capped_attention
from kafka_scorer.engine.attention.layout import AttentionLayout, to_device

Run = tuple[int, int]
"""(stream start, length)."""


@dataclass(frozen=True)
class SegmentCall:
    """One segment's attention: its query rows and the runs of keys they see."""

    query: Run
    shared: Run | None
    """The sequence's query keys, which an item sees whole; None for a run over itself."""
    own: bool
    """Whether the rows see themselves (causally in a decoder): False for hidden expansion tokens."""
    offset: int
    """Index in its sequence of the query's first row (windows count sequence indices)."""

    @property
    def keys(self) -> list[tuple[Run, int]]:
        """Each key run with the sequence index of its first key, in attention order."""
        runs = [(self.shared, 0)] if self.shared is not None else []
        return [*runs, (self.query, self.offset)] if self.own else runs


@dataclass(frozen=True)
class SegmentedMetadata:
    """The calls of one forward, O(segments), plain numbers: nothing to copy to a device."""

    layout: AttentionLayout
    calls: list[SegmentCall]
    backend: ClassVar[str] = "segmented"

    @classmethod
    def build(cls, layout: AttentionLayout, pin: bool = False) -> SegmentedMetadata:
        calls = []
        for start, length, prefix, items in zip(
            layout.seq_starts, layout.seq_lens, layout.prefix_lens, layout.item_lens
        ):
            own = prefix if items else length  # a plain pair is one run
            if own:
                calls.append(SegmentCall((start, own), None, True, 0))
            offset = prefix
            shared = (start, prefix) if prefix else None  # (the fused kernel refuses empty keys)
            for rows in items:
                # hidden keys (bidirectional items) see the sequence's other tokens only: none without
                # a query, where they are left 0 as in the dense path
                if rows and (shared is not None or layout.causal):
                    calls.append(SegmentCall((start + offset, rows), shared, layout.causal, offset))
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
    keys = _KeysByHead(k, v, q.shape[0] // k.shape[0])
    for call in metadata.calls:
        start, rows = call.query
        mask = _explicit_mask(call, window, causal, softcap is not None, q.device)
        if mask is not None:
            result = _masked(q, k, v, call, mask, scale, softcap)
        else:
            result = _fused(q[None, :, start : start + rows], keys, call, causal, scale)
        out[:, start : start + rows] = result
    return out


class _KeysByHead:
    """A run's keys and values with one head per query head ([1, H, n, d]; GQA repeats them), made once
    per layer for a sequence's query, which every item of it reads."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, groups: int) -> None:
        self.k, self.v, self.groups = k, v, groups
        self.made: dict[Run, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, run: Run, keep: bool) -> tuple[torch.Tensor, torch.Tensor]:
        if run in self.made:
            return self.made[run]
        start, length = run
        pair = tuple(
            (
                x[:, start : start + length].repeat_interleave(self.groups, 0)
                if self.groups > 1
                else x[:, start : start + length]
            )[None]
            for x in (self.k, self.v)
        )
        if keep:
            self.made[run] = pair  # type: ignore[assignment]
        return pair  # type: ignore[return-value]


_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
"""The CPU's fused kernel, which also returns each row's log-sum-exp (to merge an item's two parts)."""


def _fused(q: torch.Tensor, keys: _KeysByHead, call: SegmentCall, causal: bool, scale: float) -> torch.Tensor:
    """One segment by the fused kernel: q [1, H, rows, d] -> [H, rows, d]."""
    if call.shared is None:  # a run over itself
        return _flash(q, *keys(call.query, False), 0.0, causal, scale=scale)[0][0]
    shared, lse_shared = _flash(q, *keys(call.shared, True), 0.0, False, scale=scale)
    if not call.own:
        return shared[0]
    own, lse_own = _flash(q, *keys(call.query, False), 0.0, True, scale=scale)
    lse = torch.logaddexp(lse_shared, lse_own)
    merged = shared.float() * torch.exp(lse_shared - lse)[..., None]
    merged += own.float() * torch.exp(lse_own - lse)[..., None]
    return merged[0].to(q.dtype)


def _masked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    call: SegmentCall,
    mask: torch.Tensor,
    scale: float,
    softcap: float | None,
) -> torch.Tensor:
    """One segment by an explicit mask over its keys in order (windows, soft caps): -> [H, rows, d]."""
    start, rows = call.query
    qs = q[:, start : start + rows]
    ks, vs = (torch.cat([x[:, s : s + n] for (s, n), _ in call.keys], dim=1) for x in (k, v))
    if softcap is not None:
        return capped_attention(qs[None], ks[None], vs[None], mask, scale, softcap)[0].to(q.dtype)
    gqa = q.shape[0] != k.shape[0]
    return F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale, enable_gqa=gqa)


def _explicit_mask(
    call: SegmentCall, window: int | None, causal: bool, capped: bool, device: torch.device
) -> torch.Tensor | None:
    """[rows, keys] True = may attend, for a segment the fused calls cannot take: a soft-capped layer,
    or a window that bites (a run over itself, or any bidirectional segment, whose keys reach further
    than the window: where the dense path applies it). None: the fused calls."""
    if window is None and not capped:
        return None
    rows = call.query[1]
    q_pos = call.offset + torch.arange(rows, device=device)
    k_pos = torch.cat([first + torch.arange(n, device=device) for (_, n), first in call.keys])
    distance = q_pos[:, None] - k_pos[None, :]
    windowed = window is not None and not (causal and call.shared is not None)
    windowed = windowed and int(distance.abs().max()) >= window  # type: ignore[operator]
    if not (capped or windowed):
        return None
    allowed = torch.ones_like(distance, dtype=torch.bool)
    if causal:  # an item's shared keys all lie before its rows, so this is also the item's rule
        allowed &= distance >= 0
    if windowed:
        allowed &= distance.abs() < window  # type: ignore[operator]
    return allowed
