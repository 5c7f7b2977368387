"""Deterministic mode's attention on the CPU: fused SDPA calls shaped by one causal run alone.

A kernel's arithmetic for a row follows from the call's shapes (its blocking, the GEMMs it picks), so
a token's attention is batch-invariant when its calls hold nothing but its own run: a *segment* is a
plain pair, a packed sequence's query, or one item, which sees the sequence's query (its *shared*
keys) and then itself. A segment over itself is one flash call (causal for decoders, whole for an
encoder pair); an item is two, its shared keys and its own causally, merged by their log-sum-exps
(`cascade.merge_parts`, as the cascade merges), so the query's keys are expanded to the query heads once
per sequence, never copied per item. The calls are the same wherever the sequence sits in the stream
and whatever else the forward holds, so their bits are too. A query (or a plain pair) is moreover cut
at its prefix marks (`AttentionLayout.cuts`, the prefix cache's boundaries), each piece seeing the
pieces before it as shared keys: a cached head's states are then those of the head alone, and the
cache's hit path (`cached.py`, a `Cached` source in place of the head's stream keys) makes the very
calls its miss makes. A ColBERT query's hidden expansion tokens
(an "item" of a bidirectional sequence) see the query's other tokens only and are keys for nobody, as
in the dense path.

Measured on the CPU (`python -m kafka_scorer_bench.attention`: cpu-small's heads, one thread, float32),
ms per call against the tiled backend (`tiled.py`) and the cascade (not batch-invariant): rerank 62
vs 199 and 61, many-items 84 vs 316 and 63, SGLang's shape 82 vs 427 and 90, plain pairs 29 vs 138 and
33. On CUDA a call per item would launch thousands of kernels per layer, so deterministic mode keeps
the tiles there (`engine/load/deterministic.py`).

Per-layer variations arrive with the call: a window (only a plain pair or a bidirectional segment
longer than it is ever windowed, as in the dense path) and a soft cap (Gemma 2) take one explicit,
masked call per segment over its keys in order (`dense.capped_attention` for the cap).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from typing import ClassVar

import torch
import torch.nn.functional as F

from kafka_scorer.engine.attention.cascade import merge_parts
from kafka_scorer.engine.attention.dense import capped_attention
from kafka_scorer.engine.attention.layout import AttentionLayout, to_device

Run = tuple[int, int]
"""(stream start, length)."""


@dataclass(frozen=True)
class Cached:
    """The first `length` keys of the forward's prefix entry `entry` (`engine/pack/prefix_cache.py`): a hit
    sequence's head, which its tokens see before the stream's keys."""

    entry: int
    length: int


Source = Run | Cached


@dataclass(frozen=True)
class SegmentCall:
    """One segment's attention: its query rows, the keys before them, and whether they see themselves."""

    query: Run
    shared: tuple[Source, ...]
    """Keys every row sees whole, at sequence indices 0, 1, ... in order: the earlier pieces of the
    sequence's query (for an item: all of it), a hit's cached head first. Empty for a run over itself."""
    own: bool
    """Whether the rows see themselves (causally in a decoder): False for hidden expansion tokens."""
    offset: int
    """Index in its sequence of the query's first row (windows count sequence indices)."""
    windowed: bool = True
    """Whether a layer's window applies: a plain pair's pieces and bidirectional segments, as in the
    dense path (a packed sequence longer than a window is refused at preparation)."""

    @property
    def shared_len(self) -> int:
        return sum(source.length if isinstance(source, Cached) else source[1] for source in self.shared)


def sequence_calls(
    start: int,
    length: int,
    prefix: int,
    items: tuple[int, ...],
    cuts: tuple[int, ...],
    causal: bool,
    head: Cached | None = None,
) -> list[SegmentCall]:
    """One sequence's calls: its leading run (query or plain pair) cut at `cuts`, each piece seeing the
    pieces before it, then its items. `head`: a hit's cached prefix, before the stream's tokens."""
    lead: tuple[Source, ...] = (head,) if head is not None else ()
    before = head.length if head is not None else 0
    run = prefix if items else length  # a plain pair is one run
    bounds = [0, *(c for c in (cuts if causal else ()) if 0 < c < run), run] if run else []
    windowed = not items or not causal
    calls = [
        SegmentCall((start + a, b - a), (*lead, (start, a)) if a else lead, True, before + a, windowed)
        for a, b in pairwise(bounds)
    ]
    shared = (*lead, (start, prefix)) if prefix else lead  # (the fused kernel refuses empty keys)
    offset = prefix
    for rows in items:
        # hidden keys (bidirectional items) see the sequence's other tokens only: none without a query,
        # where they are left 0 as in the dense path
        if rows and (shared or causal):
            calls.append(SegmentCall((start + offset, rows), shared, causal, before + offset, windowed))
        offset += rows
    return calls


@dataclass(frozen=True)
class SegmentedMetadata:
    """The calls of one forward, O(segments), plain numbers: nothing to copy to a device."""

    layout: AttentionLayout
    calls: list[SegmentCall]
    backend: ClassVar[str] = "segmented"

    @classmethod
    def build(cls, layout: AttentionLayout, pin: bool = False) -> SegmentedMetadata:
        cuts = layout.cuts or [()] * len(layout.seq_starts)
        calls = [
            call
            for start, length, prefix, items, seq_cuts in zip(
                layout.seq_starts, layout.seq_lens, layout.prefix_lens, layout.item_lens, cuts
            )
            for call in sequence_calls(start, length, prefix, items, seq_cuts, layout.causal)
        ]
        return cls(layout, calls)

    def to(self, device: torch.device) -> SegmentedMetadata:
        return to_device(self, device)


CachedKeys = Callable[[int], tuple[torch.Tensor, torch.Tensor]]
"""A prefix entry's keys and values of the layer being computed, [Hkv, C, d] each."""


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
    return attend_calls(q, k, v, metadata.calls, metadata.layout.causal, scale, softcap, window)


def attend_calls(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    calls: list[SegmentCall],
    causal: bool,
    scale: float,
    softcap: float | None = None,
    window: int | None = None,
    cached: CachedKeys | None = None,
    fused: bool | None = None,
) -> torch.Tensor:
    """The calls' rows of q [H, T, d] attended, the other rows 0; `cached` resolves `Cached` keys (the
    prefix cache's hit path, `attention/cached.py`). `fused`: the CPU's flash kernel (the default on the
    CPU); elsewhere each call is one SDPA call with an explicit mask (deterministic mode runs the tiles
    on CUDA, so this backend only runs there when named, as `kafka_scorer_bench/attention.py` does)."""
    out = torch.zeros_like(q)
    keys = _Keys(k, v, q.shape[0] // k.shape[0], cached)
    fused = q.device.type == "cpu" if fused is None else fused
    for call in calls:
        start, rows = call.query
        mask = _explicit_mask(call, window, causal, softcap is not None, q.device, fused)
        if mask is not None:
            result = _masked(q, keys, call, mask, scale, softcap)
        else:
            result = _fused(q[None, :, start : start + rows], keys, call, causal, scale)
        out[:, start : start + rows] = result
    return out


class _Keys:
    """Keys and values of a call's sources: as they are ([Hkv, n, d]), or with one head per query head
    ([1, H, n, d]; GQA repeats them), the latter made once per layer for a sequence's shared keys,
    which every item of it reads."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, groups: int, cached: CachedKeys | None) -> None:
        self.k, self.v, self.groups, self.cached = k, v, groups, cached
        self.made: dict[tuple[Source, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    def plain(self, sources: tuple[Source, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        parts = [self._source(source) for source in sources]
        if len(parts) == 1:
            return parts[0]
        return torch.cat([p[0] for p in parts], dim=1), torch.cat([p[1] for p in parts], dim=1)

    def by_head(self, sources: tuple[Source, ...], keep: bool) -> tuple[torch.Tensor, torch.Tensor]:
        if sources in self.made:
            return self.made[sources]
        pair = tuple(
            (x.repeat_interleave(self.groups, 0) if self.groups > 1 else x)[None] for x in self.plain(sources)
        )
        if keep:
            self.made[sources] = pair  # type: ignore[assignment]  # tuple() of a generator is tuple[Tensor, ...]; it holds two
        return pair  # type: ignore[return-value]  # as above: the pair is two tensors by construction

    def _source(self, source: Source) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(source, Cached):
            assert self.cached is not None, "a cached prefix's keys outside the prefix cache's path"
            k, v = self.cached(source.entry)
            return k[:, : source.length], v[:, : source.length]
        start, length = source
        return self.k[:, start : start + length], self.v[:, start : start + length]


_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
"""The CPU's fused kernel, which also returns each row's log-sum-exp (to merge an item's two parts)."""


def _fused(q: torch.Tensor, keys: _Keys, call: SegmentCall, causal: bool, scale: float) -> torch.Tensor:
    """One segment by the fused kernel: q [1, H, rows, d] -> [H, rows, d]."""
    own_keys = (call.query,)
    if not call.shared:  # a run over itself
        return _flash(q, *keys.by_head(own_keys, False), 0.0, causal, scale=scale)[0][0]
    shared, lse_shared = _flash(q, *keys.by_head(call.shared, True), 0.0, False, scale=scale)
    if not call.own:
        return shared[0]
    own, lse_own = _flash(q, *keys.by_head(own_keys, False), 0.0, True, scale=scale)
    return merge_parts(shared, lse_shared, own, lse_own)[0].to(q.dtype)


def _masked(
    q: torch.Tensor, keys: _Keys, call: SegmentCall, mask: torch.Tensor, scale: float, softcap: float | None
) -> torch.Tensor:
    """One segment by an explicit mask over its keys in order (windows, soft caps): -> [H, rows, d]."""
    start, rows = call.query
    qs = q[:, start : start + rows]
    ks, vs = keys.plain((*call.shared, call.query) if call.own else call.shared)
    if softcap is not None:
        return capped_attention(qs[None], ks[None], vs[None], mask, scale, softcap)[0].to(q.dtype)
    gqa = q.shape[0] != ks.shape[0]
    return F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale, enable_gqa=gqa)


def _explicit_mask(
    call: SegmentCall, window: int | None, causal: bool, capped: bool, device: torch.device, fused: bool
) -> torch.Tensor | None:
    """[rows, keys] True = may attend, for a segment the fused calls cannot take: a soft-capped layer,
    a window that bites (`SegmentCall.windowed`, keys further than the window), or every segment where
    the fused calls cannot run (`fused` False). None: the fused calls."""
    if window is None and not capped and fused:
        return None
    rows = call.query[1]
    q_pos = call.offset + torch.arange(rows, device=device)
    k_pos = torch.arange(call.shared_len, device=device)
    if call.own:
        k_pos = torch.cat([k_pos, q_pos])
    distance = q_pos[:, None] - k_pos[None, :]
    windowed = window is not None and call.windowed and int(distance.abs().max()) >= window
    if not (capped or windowed or not fused):
        return None
    allowed = torch.ones_like(distance, dtype=torch.bool)
    if causal:  # a segment's shared keys all lie before its rows, so this is also the item's rule
        allowed &= distance >= 0
    if windowed:
        allowed &= distance.abs() < window  # type: ignore[operator]  # window is an int whenever windowed is true
    return allowed
