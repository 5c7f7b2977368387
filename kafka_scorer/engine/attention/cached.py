"""Attention for a batch some of whose sequences start with a cached prefix (`engine/pack/prefix_cache.py`).

The stream is cut in two (`engine/pack/prefix_batch.py` orders it so): the front, sequences that run in
full, attended to by the batch's backend unchanged; and the hit sequences, which hold only the tokens
after their cached prefix, at positions C and on. Every hit token sees the whole cached prefix (it
lies before the query's first uncached token, and every item sees the whole query) and, among the
sequence's own tokens, what SPEC §5 says a token sees. The hit tokens are cut into causal blocks (a
plain pair; a packed sequence's cut query; each of its items) and one softmax runs over two key sets:

- shared keys: the prefix's, [Hkv, C, d] of this layer, one copy however many blocks use it (for an
  item, followed by its sequence's cut query, which every item sees whole);
- the block's own keys, causally.

Work follows the MIS mask as in the cascade: n·I·(C+Q+I) for a packed sequence, never (Q+n·I)². Scores
are formed explicitly in float32 (the blocks are short: the prefix was the long part), and the two
sets share one max and one normaliser, so the result is the attention over the whole prompt.
A prefix computed in a forward (a fill) is a slice of this layer's keys and values: the front
sequence that computes it is stored into its entry first, and any hit of the forward reads the entry.
A longer prefix can also extend a shorter one (an extension): a hit sequence whose tokens complete it
stores the shorter prefix's states followed by its own, so a query that comes back after its
template's head was cached is kept whole without running the head again. (`engine/pack/prefix_batch.py`
computes heads in forwards of their own, before the forward that hits them.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Protocol

import torch

from kafka_scorer.engine.attention.dense import soft_cap
from kafka_scorer.engine.attention.layout import AttentionLayout, bucket_by_length, host, to_device
from kafka_scorer.engine.attention.segmented import (
    Cached,
    SegmentCall,
    SegmentedMetadata,
    attend_calls,
    sequence_calls,
)


class StoredPrefix(Protocol):
    """A prefix's keys and values per layer, as the prefix cache keeps them (`engine/pack/prefix_cache.py`'s
    `StoredPrefix`): this layer stores into the one its forward fills and reads the ones it hits. Named
    by what is used, since the cache (the pack stage) sits above the attention it serves."""

    @property
    def length(self) -> int: ...
    def store(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None: ...
    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]: ...


# float32 scores formed at once per hit group (256 MiB); a larger group goes by slices of its sequences.
_SCORES_BUDGET = 1 << 26


@dataclass(frozen=True)
class HitSequence:
    """One sequence of the hit part: where it starts in the stream, its MIS shape after the cut, and
    the index of its prefix in `PrefixedMetadata.entries`."""

    start: int
    prefix: int
    items: tuple[int, ...]
    source: int
    cuts: tuple[int, ...] = ()
    """Where its cut query may be cut again (`AttentionLayout.cuts`): deterministic mode's hit path."""

    @property
    def length(self) -> int:
        return self.prefix + sum(self.items)


@dataclass(frozen=True)
class HitGroup:
    """Causal blocks of one prefix, padded to [S, L]: each block's tokens see the whole prefix, the
    `head` keys if any, and the block's own earlier tokens. A block is a cut plain pair, the cut query
    of a packed sequence, or (with the query as `head`) one of its items."""

    source: int
    gather: torch.Tensor
    """[S*L] flat stream index of each padded slot (padding repeats the block's last token)."""
    size: int
    length: int
    own_mask: torch.Tensor
    """[S, L, L] True where a token may attend to a token of its own block (causal, real keys)."""
    valid: torch.Tensor
    """Rows of the padded [S*L] output that hold real tokens."""
    positions: torch.Tensor
    """Their flat positions in the stream."""
    head_start: int = 0
    head_len: int = 0
    """Stream tokens every block of the group sees besides the prefix: a packed sequence's cut query,
    for its items (one group per packed sequence, so the query is one slice)."""


@dataclass(frozen=True)
class PrefixedMetadata:
    layout: AttentionLayout
    """The whole stream's layout (hit sequences with their cut prefix lengths)."""
    front: Any
    """The backend's metadata for the first `front_tokens` tokens; None when every sequence hits."""
    front_tokens: int
    entries: Sequence[StoredPrefix]
    """The prefixes this forward attends to, cached or filled now."""
    fills: list[tuple[int, int]]
    """(entry index, stream start of the front sequence that begins with it): stored per layer."""
    hits: list[HitGroup]
    extends: tuple[tuple[int, int, int], ...] = ()
    """(entry index, index of the shorter entry it extends, stream start of the hit sequence whose
    first tokens complete it): stored per layer after the fills, before any hit reads it."""
    segment_calls: list[SegmentCall] | None = None
    """Deterministic mode on the CPU: the hits as the segmented backend's calls, their cached heads
    read from the entries, in place of `hits` (a hit then computes what its miss computes, bit for bit)."""
    starts: tuple[tuple[int, int], ...] = ()
    """(stream start, entry index) of each hit sequence: where a hybrid's stateful layers start a cut
    sequence from its head's state (`engine/recurrent/runs.py`)."""
    backend: ClassVar[str] = "prefixed"

    @classmethod
    def build(
        cls,
        layout: AttentionLayout,
        front: Any,
        front_tokens: int,
        entries: Sequence[StoredPrefix],
        fills: list[tuple[int, int]],
        sequences: list[HitSequence],
        pin: bool,
        extends: tuple[tuple[int, int, int], ...] = (),
        front_backend: str = "",
    ) -> PrefixedMetadata:
        sources = tuple((seq.start, seq.source) for seq in sequences)
        if front_backend == SegmentedMetadata.backend:
            calls = [
                call
                for seq in sequences
                for call in sequence_calls(
                    seq.start, seq.length, seq.prefix, seq.items, seq.cuts, True,
                    Cached(seq.source, entries[seq.source].length),
                )
            ]  # fmt: skip
            return cls(layout, front, front_tokens, entries, fills, [], extends, calls, sources)
        groups: list[HitGroup] = []
        for source in sorted({seq.source for seq in sequences}):
            # causal blocks: plain pairs whole, packed sequences' cut queries; bucketed by length
            blocks = [(seq.start, seq.prefix) for seq in sequences if seq.source == source and seq.prefix]
            groups.extend(_hit_group(source, bucket, pin) for bucket in bucket_by_length(blocks))
        for seq in sequences:
            # a packed sequence's items: each sees the prefix and the cut query whole, and itself causally
            starts = seq.start + seq.prefix + torch.tensor([0, *seq.items[:-1]]).cumsum(0)
            items = [(int(start), n) for start, n in zip(starts, seq.items) if n]
            if items:
                groups.append(_hit_group(seq.source, items, pin, head=(seq.start, seq.prefix)))
        return cls(layout, front, front_tokens, entries, fills, groups, extends, starts=sources)

    @property
    def filled(self) -> list[StoredPrefix]:
        """The entries this forward computed: the cache keeps them once the forward has succeeded."""
        made = [index for index, _ in self.fills] + [index for index, _, _ in self.extends]
        return [self.entries[index] for index in made]

    def to(self, device: torch.device) -> PrefixedMetadata:
        """Entries stay as they are (already on the device, and filled in place)."""
        front = None if self.front is None else self.front.to(device)
        return replace(self, front=front, hits=[to_device(group, device) for group in self.hits])


def _hit_group(
    source: int, blocks: list[tuple[int, int]], pin: bool, head: tuple[int, int] = (0, 0)
) -> HitGroup:
    """(start, length) causal blocks padded to the longest; padded keys are masked, padded rows dropped."""
    longest = max(length for _, length in blocks)
    offsets = torch.arange(longest)
    lengths = torch.tensor([length for _, length in blocks])
    starts = torch.tensor([start for start, _ in blocks])
    gather = starts[:, None] + torch.minimum(offsets[None, :], lengths[:, None] - 1)
    real = offsets[None, :] < lengths[:, None]
    causal = torch.ones(longest, longest, dtype=torch.bool).tril_()
    own = causal[None] & real[:, None, :]
    flat_real = real.reshape(-1)
    return HitGroup(
        source=source,
        gather=host(gather.reshape(-1), pin),
        size=len(blocks),
        length=longest,
        own_mask=host(own, pin),
        valid=host(flat_real.nonzero().squeeze(1), pin),
        positions=host(gather.reshape(-1)[flat_real], pin),
        head_start=head[0],
        head_len=head[1],
    )


def prefixed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    metadata: PrefixedMetadata,
    layer: int,
    attend_front: Callable[..., torch.Tensor],
    scale: float,
    softcap: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """q [H, T, d], k/v [Hkv, T, d] -> [H, T, d]: the front by its backend, the hits against their
    prefix and themselves. `layer` picks the prefix's states; `attend_front` is the registry's
    dispatch (passed in, so this module needs no registry)."""
    for index, start in metadata.fills:
        entry = metadata.entries[index]
        entry.store(layer, k[:, start : start + entry.length], v[:, start : start + entry.length])
    for index, shorter, start in metadata.extends:
        entry, (short_k, short_v) = metadata.entries[index], metadata.entries[shorter].layer(layer)
        end = start + entry.length - short_k.shape[1]
        entry.store(
            layer, torch.cat([short_k, k[:, start:end]], dim=1), torch.cat([short_v, v[:, start:end]], dim=1)
        )
    heads, total, dim = q.shape
    out = torch.empty(total, heads, dim, dtype=q.dtype, device=q.device)
    front = metadata.front_tokens
    if metadata.front is not None:
        part = attend_front(q[:, :front], k[:, :front], v[:, :front], metadata.front, scale, softcap, window)
        out[:front] = part.transpose(0, 1)
    if metadata.segment_calls is not None:
        cached = lambda entry: metadata.entries[entry].layer(layer)  # noqa: E731
        hits = attend_calls(q, k, v, metadata.segment_calls, True, scale, softcap, window, cached)
        out[front:] = hits[:, front:].transpose(0, 1)
        return out.transpose(0, 1)
    if metadata.hits:
        flat_out = out.view(total, heads * dim)
        rows = [x.transpose(0, 1).reshape(total, -1) for x in (q, k, v)]
        for group in metadata.hits:
            prefix_k, prefix_v = metadata.entries[group.source].layer(layer)
            if group.head_len:
                head = slice(group.head_start, group.head_start + group.head_len)
                prefix_k = torch.cat([prefix_k, k[:, head]], dim=1)
                prefix_v = torch.cat([prefix_v, v[:, head]], dim=1)
            attended = _hit_attention(group, rows, prefix_k, prefix_v, heads, scale, softcap)
            flat_out.index_copy_(0, group.positions, attended.index_select(0, group.valid).to(q.dtype))
    return out.transpose(0, 1)


def _hit_attention(
    group: HitGroup,
    rows: list[torch.Tensor],
    prefix_k: torch.Tensor,
    prefix_v: torch.Tensor,
    heads: int,
    scale: float,
    softcap: float | None,
) -> torch.Tensor:
    """The group's padded tokens as rows [S*L, H*d], by slices of sequences within budget."""
    if prefix_k.device.type == "cpu" and softcap is None:
        gather = group.gather
        return _attend_fused(rows, gather, group.size, group.length, prefix_k, prefix_v, heads, scale)
    cached = prefix_k.shape[1]
    length = group.length
    per_sequence = heads * length * (cached + length)
    step = max(1, _SCORES_BUDGET // max(1, per_sequence))
    parts = []
    for first in range(0, group.size, step):
        count = min(step, group.size - first)
        gather = group.gather[first * length : (first + count) * length]
        mask = group.own_mask[first : first + count]
        parts.append(
            _attend_slice(rows, gather, mask, count, length, prefix_k, prefix_v, heads, scale, softcap)
        )
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def _attend_fused(
    rows: list[torch.Tensor],
    gather: torch.Tensor,
    count: int,
    length: int,
    prefix_k: torch.Tensor,
    prefix_v: torch.Tensor,
    heads: int,
    scale: float,
) -> torch.Tensor:
    """The same softmax from two calls of PyTorch's fused CPU flash kernel, which never forms the scores
    and returns each part's log-sum-exp: the blocks against the shared keys (unmasked, one copy of them
    for every block) and each block against itself (causal: right padding is behind every real query,
    so it needs no mask); the parts merge by log-sum-exp, as the cascade's do."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    rows_q, rows_k, rows_v = rows
    kv_heads, cached, dim = prefix_k.shape
    groups = heads // kv_heads
    q = rows_q.index_select(0, gather).view(count, length, kv_heads, groups, dim).permute(0, 2, 3, 1, 4)
    q = q.reshape(count * kv_heads, groups, length, dim)  # [S·Hkv, g, L, d]

    def own(x: torch.Tensor) -> torch.Tensor:
        x = x.index_select(0, gather).view(count, length, kv_heads, dim).permute(0, 2, 1, 3)
        return x.reshape(count * kv_heads, 1, length, dim).expand(count * kv_heads, groups, length, dim)

    o_own, lse_own = flash(q, own(rows_k), own(rows_v), 0.0, True, scale=scale)
    q_shared = q.view(count, kv_heads, groups, length, dim).permute(1, 2, 0, 3, 4)
    q_shared = q_shared.reshape(kv_heads, groups, count * length, dim)
    k_shared = prefix_k[:, None].expand(kv_heads, groups, cached, dim)
    v_shared = prefix_v[:, None].expand(kv_heads, groups, cached, dim)
    o_pre, lse_pre = flash(q_shared, k_shared, v_shared, 0.0, False, scale=scale)
    # both as [S, Hkv, g, L, ...]
    o_pre = o_pre.view(kv_heads, groups, count, length, dim).permute(2, 0, 1, 3, 4)
    lse_pre = lse_pre.view(kv_heads, groups, count, length).permute(2, 0, 1, 3)
    o_own = o_own.view(count, kv_heads, groups, length, dim)
    lse_own = lse_own.view(count, kv_heads, groups, length)
    lse = torch.logaddexp(lse_pre, lse_own)
    out = o_pre * torch.exp(lse_pre - lse)[..., None] + o_own * torch.exp(lse_own - lse)[..., None]
    return out.permute(0, 3, 1, 2, 4).reshape(count * length, heads * dim)


def _attend_slice(
    rows: list[torch.Tensor],
    gather: torch.Tensor,
    own_mask: torch.Tensor,
    count: int,
    length: int,
    prefix_k: torch.Tensor,
    prefix_v: torch.Tensor,
    heads: int,
    scale: float,
    softcap: float | None,
) -> torch.Tensor:
    """One softmax over [prefix keys | own keys] for `count` padded sequences of `length` tokens.

    Query heads are laid out [Hkv, S, g, L] so the prefix scores are one batched matmul per kv head
    against the single prefix copy (no per-sequence expansion), and the own scores one per (kv head,
    sequence)."""
    rows_q, rows_k, rows_v = rows
    kv_heads, cached, dim = prefix_k.shape
    groups = heads // kv_heads
    q = rows_q.index_select(0, gather).float().view(count, length, kv_heads, groups, dim)
    q = q.permute(2, 0, 3, 1, 4).reshape(kv_heads, count * groups * length, dim)
    k_own = rows_k.index_select(0, gather).float().view(count, length, kv_heads, dim)
    v_own = rows_v.index_select(0, gather).float().view(count, length, kv_heads, dim)
    k_own = k_own.permute(2, 0, 1, 3).reshape(kv_heads * count, length, dim)
    v_own = v_own.permute(2, 0, 1, 3).reshape(kv_heads * count, length, dim)

    pre = torch.bmm(q, prefix_k.float().transpose(1, 2)) * scale  # [Hkv, S*g*L, C]
    q_own = q.view(kv_heads * count, groups * length, dim)
    own = torch.bmm(q_own, k_own.transpose(1, 2)) * scale  # [Hkv*S, g*L, L]
    if softcap is not None:
        pre, own = soft_cap(pre, softcap), soft_cap(own, softcap)
    own = own.view(kv_heads, count, groups, length, length)
    own = own.masked_fill(~own_mask[None, :, None], float("-inf"))
    pre = pre.view(kv_heads, count, groups, length, cached)
    # Every token sees at least one prefix key, so the shared max is finite.
    top = torch.maximum(pre.amax(-1), own.amax(-1))[..., None]
    pre = torch.exp(pre - top)
    own = torch.exp(own - top)
    norm = pre.sum(-1, keepdim=True) + own.sum(-1, keepdim=True)
    out = torch.bmm(pre.view(kv_heads, -1, cached), prefix_v.float())
    out = out.view(kv_heads, count, groups, length, dim)
    out = out + torch.bmm(own.view(kv_heads * count, groups * length, length), v_own).view_as(out)
    out = out / norm
    return out.permute(1, 3, 0, 2, 4).reshape(count * length, heads * dim)
