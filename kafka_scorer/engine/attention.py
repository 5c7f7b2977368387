"""Attention over a packed batch: plain causal pairs and MIS sequences, several jobs per forward.

The batch is one flat token stream. `AttentionLayout` (built on the CPU by `engine/batch.py`, once per
batch) says where each sequence starts, how long its shared prefix (the query) is and how long each
item after it is. Rule (SPEC §5): a prefix token sees the prefix causally; an item token sees the whole
prefix and the earlier tokens of its own item. A plain pair is a sequence with no items. An encoder's
layout (`causal=False`, SPEC §8) has plain pairs only, and each pair's tokens see all of that pair's
tokens, and nothing of any other pair: block-diagonal bidirectional attention over the flat stream.

The function is registered in transformers' attention registry, so HF decoder layers call it with
RoPE already applied; it reads the layout from the forward's kwargs, never from `input_ids`.

Backends, chosen per batch:
- `dense`: SDPA per sequence with an explicit boolean mask — the portable reference.
- `flex`: FlexAttention with a block mask built once per batch (compiled on CUDA).
- `cascade`: cost follows the mask. Prefix causal attention once per sequence; every item attends to
  the prefix in one rectangular attention and to itself in a small causal block; the two partial
  results merge by log-sum-exp. Work is about n·I·(Q+I) instead of (Q+n·I)².

Two things vary per layer, not per batch, so they arrive with each call rather than on the layout:
logit soft-capping (Gemma 2: `cap · tanh(q·kᵀ·scale / cap)` before the mask) and the sliding window
(Gemma 2 alternates windowed and full layers). Without a cap every backend runs exactly its uncapped
code; with one, the steps that use a fused kernel which cannot cap form their scores explicitly.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

ATTENTION_IMPLEMENTATION = "kafka_scorer"
LAYOUT_KWARG = "scorer_layout"

Backend = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, "AttentionLayout", float, "float | None", "int | None"],
    torch.Tensor,
]


@dataclass
class AttentionLayout:
    """Per-batch attention metadata: CPU lists from tokenization plus device tensors built once."""

    seq_starts: list[int]
    seq_lens: list[int]
    prefix_lens: list[int]
    item_lens: list[tuple[int, ...]]
    device: torch.device
    backend: str = "dense"
    sliding_window: int | None = None
    """The model's window, for layers whose call does not name their own (see `scorer_attention`)."""
    causal: bool = True
    """False for encoders: plain pairs only, each token sees its whole pair (a window is then |i - j|)."""
    _cache: dict[str, object] = field(default_factory=dict, repr=False)

    @property
    def total_tokens(self) -> int:
        return sum(self.seq_lens)

    def prepare_on_host(self) -> None:
        """Build the backend's CPU-side index now (the packing thread calls this), so the device thread
        only copies it over, from pinned memory on CUDA, on the first layer."""
        builder = _HOST_INDEX_BUILDERS.get(self.backend)
        if builder is not None:
            self.cached(f"{self.backend}_host", lambda: builder(self))

    def pinned(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.pin_memory() if self.device.type == "cuda" else tensor

    def cached(self, key: str, build: Callable[[], object]) -> object:
        """Masks and index tensors are built on the first layer and reused by all the others."""
        value = self._cache.get(key)
        if value is None:
            value = build()
            self._cache[key] = value
        return value


def segment_ids(prefix_len: int, item_lens: tuple[int, ...]) -> torch.Tensor:
    """0 for prefix tokens, k+1 for tokens of item k (CPU)."""
    parts = [torch.zeros(prefix_len, dtype=torch.int32)]
    parts += [torch.full((n,), k + 1, dtype=torch.int32) for k, n in enumerate(item_lens)]
    return torch.cat(parts)


def sequence_mask(
    prefix_len: int, item_lens: tuple[int, ...], window: int | None = None, causal: bool = True
) -> torch.Tensor:
    """Boolean [L, L] mask (True = may attend) of one sequence, SPEC §5 (causal) or §8 (bidirectional)."""
    seg = segment_ids(prefix_len, item_lens)
    length = seg.numel()
    idx = torch.arange(length)
    distance = idx[:, None] - idx[None, :]
    if causal:
        allowed = distance >= 0
        allowed &= (seg[None, :] == 0) | (seg[None, :] == seg[:, None])
    else:
        allowed = torch.ones(length, length, dtype=torch.bool)
        distance = distance.abs()
    if window is not None and not item_lens:
        allowed &= distance < window
    return allowed


def dense_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: AttentionLayout,
    scale: float,
    softcap: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """q [H, T, d], k/v [Hkv, T, d] -> [H, T, d]; one SDPA call per sequence with its own mask.

    SDPA cannot soft-cap, so a capped layer forms each sequence's scores explicitly instead.
    """

    def build_masks() -> list[torch.Tensor | None]:
        masks: list[torch.Tensor | None] = []
        for prefix, items, length in zip(layout.prefix_lens, layout.item_lens, layout.seq_lens):
            plain = not items and (window is None or length <= window)
            if plain:
                masks.append(None)
            else:
                masks.append(sequence_mask(prefix, items, window, layout.causal).to(layout.device))
        return masks

    masks = layout.cached(f"dense_masks:{window}", build_masks)
    gqa = q.shape[0] != k.shape[0]
    outputs = []
    for start, length, mask in zip(layout.seq_starts, layout.seq_lens, masks):
        end = start + length
        if softcap is not None:
            if mask is None:
                mask = torch.ones(length, length, dtype=torch.bool, device=q.device)
                mask = mask.tril_() if layout.causal else mask
            out = _capped_attention(
                q[None, :, start:end], k[None, :, start:end], v[None, :, start:end], mask, scale, softcap
            )
            outputs.append(out[0].to(q.dtype))
            continue
        outputs.append(
            F.scaled_dot_product_attention(
                q[:, start:end],
                k[:, start:end],
                v[:, start:end],
                attn_mask=mask,
                is_causal=mask is None and layout.causal,
                scale=scale,
                enable_gqa=gqa,
            )
        )
    return torch.cat(outputs, dim=1)


def soft_cap(scores: torch.Tensor, cap: float) -> torch.Tensor:
    """`cap · tanh(scores / cap)`: Gemma 2's bound on attention scores and final logits."""
    return torch.tanh(scores / cap) * cap


# float32 scores formed at once by the explicit soft-capped path (256 MiB); longer inputs go by query rows.
_SCORES_BUDGET = 1 << 26


def _capped_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, softcap: float
) -> torch.Tensor:
    """Soft-capped masked attention with explicit scores: q [B, H, Lq, d] -> float32 [B, H, Lq, d].

    k/v are [B, Hkv, Lk, d] (GQA by a view, no copy); `mask` (True = may attend) is [Lq, Lk], shared by
    the batch, and applies after the cap, as in Gemma 2.
    """
    batch, heads, q_len, dim = q.shape
    kv_heads, k_len = k.shape[1], k.shape[2]
    qg = q.view(batch, kv_heads, heads // kv_heads, q_len, dim)
    kt, vg = k[:, :, None].transpose(-1, -2), v[:, :, None]
    out = torch.empty(qg.shape, dtype=torch.float32, device=q.device)
    step = max(1, _SCORES_BUDGET // max(1, batch * heads * k_len))
    for row in range(0, q_len, step):
        rows = slice(row, row + step)
        scores = soft_cap(torch.matmul(qg[..., rows, :], kt).float() * scale, softcap)
        probs = torch.softmax(scores.masked_fill_(~mask[rows], float("-inf")), dim=-1).to(v.dtype)
        out[..., rows, :] = torch.matmul(probs, vg)
    return out.view(batch, heads, q_len, dim)


@dataclass
class _CascadeIndex:
    """Gather/scatter indices of the cascade backend, built once per batch on the CPU."""

    prefix_groups: list[tuple[torch.Tensor, torch.Tensor]]
    """(gather index [S, Lmax], [2, valid] rows of the padded output and their flat positions) per group
    of similar-length prefixes."""
    mis: list[tuple[int, int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]
    """Per MIS sequence: prefix start, prefix length, item gather index [n, I], item key mask
    [n, I, I], valid-row selector [n*I] and the valid rows' flat positions."""

    def to(self, device: torch.device) -> _CascadeIndex:
        def move(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.to(device, non_blocking=True)

        return _CascadeIndex(
            prefix_groups=[(move(gather), move(rows)) for gather, rows in self.prefix_groups],
            mis=[(start, prefix, *map(move, tensors)) for start, prefix, *tensors in self.mis],  # type: ignore[misc]
        )


def _bucket_by_length(entries: list[tuple[int, int]], slack: float = 1.25) -> list[list[tuple[int, int]]]:
    """Group (start, length) spans so padding each group to its longest costs at most `slack`."""
    groups: list[list[tuple[int, int]]] = []
    for start, length in sorted(entries, key=lambda e: -e[1]):
        if groups:
            group = groups[-1]
            longest = group[0][1]
            real = sum(g[1] for g in group) + length
            if longest * (len(group) + 1) <= slack * real:
                group.append((start, length))
                continue
        groups.append([(start, length)])
    return groups


@dataclass
class _PairGroup:
    """Encoder pairs of similar length, attended to in one padded SDPA call (cascade, `causal=False`)."""

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

    def to(self, device: torch.device) -> _PairGroup:
        def move(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.to(device, non_blocking=True)

        keys = None if self.keys is None else move(self.keys)
        return _PairGroup(
            move(self.gather), self.size, self.length, keys, move(self.valid), move(self.positions)
        )


@dataclass
class _PairIndex:
    groups: list[_PairGroup]

    def to(self, device: torch.device) -> _PairIndex:
        return _PairIndex([group.to(device) for group in self.groups])


def _pair_host_index(layout: AttentionLayout) -> _PairIndex:
    """Length buckets of an encoder batch, gathered row-wise (token-major), the cheap way on a CPU."""
    pin = layout.pinned
    groups = []
    for group in _bucket_by_length(list(zip(layout.seq_starts, layout.seq_lens))):
        longest = group[0][1]
        offsets = torch.arange(longest)
        lengths = torch.tensor([length for _, length in group])
        starts = torch.tensor([start for start, _ in group])
        gather = starts[:, None] + torch.minimum(offsets[None, :], lengths[:, None] - 1)
        real = offsets[None, :] < lengths[:, None]
        keys = None if bool(real.all()) else pin(real[:, None, None, :])
        flat_real = real.reshape(-1)
        groups.append(
            _PairGroup(
                gather=pin(gather.reshape(-1)),
                size=len(group),
                length=longest,
                keys=keys,
                valid=pin(flat_real.nonzero().squeeze(1)),
                positions=pin(gather.reshape(-1)[flat_real]),
            )
        )
    return _PairIndex(groups)


def _bidirectional_pairs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, index: _PairIndex, scale: float
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
    for group in index.groups:
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


def _cascade_host_index(layout: AttentionLayout) -> _CascadeIndex | _PairIndex:
    """The cascade's gather/scatter indices as CPU tensors (pinned on CUDA)."""
    if not layout.causal:
        return _pair_host_index(layout)
    pin = layout.pinned
    prefixes = [(start, prefix) for start, prefix in zip(layout.seq_starts, layout.prefix_lens) if prefix > 0]
    prefix_groups = []
    for group in _bucket_by_length(prefixes):
        longest = group[0][1]
        offsets = torch.arange(longest)
        gather = torch.stack([start + offsets.clamp(max=length - 1) for start, length in group])
        valid = torch.cat([start + torch.arange(length) for start, length in group])
        flat_valid = torch.cat(
            [row * longest + torch.arange(length) for row, (_, length) in enumerate(group)]
        )
        prefix_groups.append((pin(gather), pin(torch.stack([flat_valid, valid]))))
    mis = []
    for start, prefix, items in zip(layout.seq_starts, layout.prefix_lens, layout.item_lens):
        if not items or max(items) == 0:
            continue
        longest = max(items)
        offsets = torch.arange(longest)
        item_starts = start + prefix + torch.tensor([0, *items[:-1]]).cumsum(0)
        lengths = torch.tensor(items)
        # Padded slots point at the item's first token (or the sequence start for an empty item);
        # they are masked as keys and dropped as queries.
        gather = item_starts[:, None] + torch.minimum(offsets[None, :], (lengths[:, None] - 1).clamp(min=0))
        gather = torch.where(lengths[:, None] > 0, gather, start)
        key_valid = offsets[None, :] < lengths[:, None]
        causal = offsets[None, :] <= offsets[:, None]
        key_mask = causal[None, :, :] & key_valid[:, None, :]
        valid_rows = key_valid.reshape(-1)
        positions = gather.reshape(-1)[valid_rows]
        mis.append(
            (
                start,
                prefix,
                pin(gather),
                pin(key_mask),
                pin(valid_rows),
                pin(positions),
            )
        )
    return _CascadeIndex(prefix_groups=prefix_groups, mis=mis)


def cascade_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: AttentionLayout,
    scale: float,
    softcap: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Shared-prefix attention whose work follows the mask.

    1. Every prefix (a query, or a whole plain pair) attends causally to itself: similar lengths are
       batched into one SDPA call; right padding is harmless under a causal mask.
    2. The items of a MIS sequence attend to their prefix in one rectangular attention [n·I, Q] (on
       the CPU the fused flash kernel, which never materialises the scores) and to their own item in
       block-diagonal [n, I, I] products; the two partial results merge by log-sum-exp, so nothing of
       size (Q + n·I)² is ever formed.

    With a soft-cap, the steps that use fused kernels (1 and the item-vs-prefix part of 2) form their
    scores explicitly, since neither kernel can cap; the block structure stays the same.
    """
    if window is not None and max(layout.seq_lens) > window:
        return dense_attention(q, k, v, layout, scale, softcap, window)
    if softcap is not None and not layout.causal:
        return dense_attention(q, k, v, layout, scale, softcap, window)
    index = layout.cached("cascade_index", lambda: _host_index(layout, "cascade").to(layout.device))
    if isinstance(index, _PairIndex):
        return _bidirectional_pairs(q, k, v, index, scale)
    assert isinstance(index, _CascadeIndex)
    heads, _, dim = q.shape
    kv_heads = k.shape[0]
    groups = heads // kv_heads
    out = torch.empty_like(q)

    for gather, (flat_valid, positions) in index.prefix_groups:
        qp = q[:, gather].transpose(0, 1)  # [S, H, L, d]
        kp = k[:, gather].transpose(0, 1)
        vp = v[:, gather].transpose(0, 1)
        if softcap is None:
            op = F.scaled_dot_product_attention(
                qp, kp, vp, is_causal=True, scale=scale, enable_gqa=groups > 1
            )
        else:
            length = gather.shape[1]
            causal = torch.ones(length, length, dtype=torch.bool, device=q.device).tril_()
            op = _capped_attention(qp, kp, vp, causal, scale, softcap).to(q.dtype)
        rows = op.transpose(0, 1).reshape(heads, -1, dim)  # [H, S*L, d]
        out[:, positions] = rows[:, flat_valid]

    qg = q.view(kv_heads, groups, -1, dim)
    for start, prefix, gather, key_mask, valid_rows, positions in index.mis:
        n, longest = gather.shape
        q_items = qg[:, :, gather]  # [Hkv, g, n, I, d]
        o_own, lse_own = _own_item_attention(q_items, k[:, gather], v[:, gather], key_mask, scale, softcap)
        if prefix > 0:
            k_prefix = k[:, None, start : start + prefix].expand(kv_heads, groups, prefix, dim)
            v_prefix = v[:, None, start : start + prefix].expand(kv_heads, groups, prefix, dim)
            o_pre, lse_pre = _attention_with_lse(
                q_items.reshape(kv_heads, groups, n * longest, dim), k_prefix, v_prefix, scale, softcap
            )
            o = _merge(o_pre.view_as(o_own), lse_pre.view_as(lse_own), o_own, lse_own)
        else:
            o = o_own
        rows = o.reshape(heads, n * longest, dim)
        out[:, positions] = rows[:, valid_rows].to(out.dtype)
    return out


def _attention_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, softcap: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unmasked attention returning the log-sum-exp too, so partial results can be merged.

    On the CPU, PyTorch's fused flash kernel already returns it and never materialises the scores;
    elsewhere, or with a soft-cap (which that kernel cannot apply), the scores are formed explicitly
    (the CUDA default is the flex backend anyway).
    """
    if q.device.type == "cpu" and softcap is None:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, False, scale=scale
        )
        return out, lse
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale
    if softcap is not None:
        scores = soft_cap(scores, softcap)
    lse = torch.logsumexp(scores, dim=-1)
    return torch.matmul(torch.exp(scores - lse[..., None]).to(v.dtype), v), lse


def _own_item_attention(
    q_items: torch.Tensor,
    k_items: torch.Tensor,
    v_items: torch.Tensor,
    key_mask: torch.Tensor,
    scale: float,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each item's tokens against the earlier tokens of the same item: [Hkv, g, n, I, I] scores."""
    scores = torch.einsum("hgnid,hnjd->hgnij", q_items, k_items).float() * scale
    if softcap is not None:
        scores = soft_cap(scores, softcap)
    scores = scores.masked_fill(~key_mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse[..., None]).to(v_items.dtype)
    return torch.einsum("hgnij,hnjd->hgnid", probs, v_items), lse


def _merge(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor) -> torch.Tensor:
    """Softmax over the union of two disjoint key sets, from each part's output and log-sum-exp."""
    lse = torch.logaddexp(lse_a, lse_b)
    return o_a.float() * torch.exp(lse_a - lse)[..., None] + o_b.float() * torch.exp(lse_b - lse)[..., None]


_FLEX_BLOCK = 128  # FlexAttention's sparse block size (its default)


def _flex_block_mask(layout: AttentionLayout) -> object:
    """One BlockMask per batch, built from the layout's block lists: O(T) per-token ids for the mask
    rule plus a `[q_blocks, kv_blocks]` index, never a `T × T` mask (`create_block_mask` evaluates the
    rule on every token pair: gigabytes at the model's context length). Blocks wholly outside the
    SPEC §5 / §8 mask are never listed, so the kernel skips them; the listed ones apply the rule."""
    from torch.nn.attention.flex_attention import BlockMask

    doc, seg, counts, indices = (t.to(layout.device, non_blocking=True) for t in _host_index(layout, "flex"))

    def allowed(batch, head, q_idx, kv_idx):
        same_item = (seg[kv_idx] == 0) | (seg[kv_idx] == seg[q_idx])
        return (doc[q_idx] == doc[kv_idx]) & (kv_idx <= q_idx) & same_item

    def bidirectional(batch, head, q_idx, kv_idx):
        return doc[q_idx] == doc[kv_idx]

    total = layout.total_tokens
    return BlockMask.from_kv_blocks(
        counts,
        indices,
        BLOCK_SIZE=_FLEX_BLOCK,
        mask_mod=allowed if layout.causal else bidirectional,
        seq_lengths=(total, total),
    )


def _flex_kv_blocks(layout: AttentionLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """For each query block, the key blocks any of its tokens may see, from the segments it overlaps:
    a prefix token sees its sequence's prefix up to itself; an item token sees the prefix and its own
    item up to itself; an encoder token sees its whole pair. Work follows the segments, not the tokens."""
    blocks = -(-layout.total_tokens // _FLEX_BLOCK)
    needed: list[set[int]] = [set() for _ in range(blocks)]

    def add(q_start: int, q_end: int, kv_ranges: Callable[[int], list[tuple[int, int]]]) -> None:
        for qb in range(q_start // _FLEX_BLOCK, (q_end - 1) // _FLEX_BLOCK + 1):
            last_q = min(q_end, (qb + 1) * _FLEX_BLOCK)  # one past this block's last token of the segment
            for lo, hi in kv_ranges(last_q):
                if hi > lo:
                    needed[qb].update(range(lo // _FLEX_BLOCK, (hi - 1) // _FLEX_BLOCK + 1))

    for start, length, prefix, items in zip(
        layout.seq_starts, layout.seq_lens, layout.prefix_lens, layout.item_lens
    ):
        if length == 0:
            continue
        if not layout.causal:
            add(start, start + length, lambda _, s=start, n=length: [(s, s + n)])
            continue
        if prefix:
            add(start, start + prefix, lambda last, s=start: [(s, last)])
        item_start = start + prefix
        for n in items:
            if n:
                add(
                    item_start,
                    item_start + n,
                    lambda last, s=start, p=prefix, i=item_start: [(s, s + p), (i, last)],
                )
            item_start += n
    counts = torch.tensor([len(b) for b in needed], dtype=torch.int32)
    indices = torch.zeros((blocks, blocks), dtype=torch.int32)  # BlockMask's layout: [q, kv] blocks
    for qb, kv in enumerate(needed):
        if kv:
            indices[qb, : len(kv)] = torch.tensor(sorted(kv), dtype=torch.int32)
    return layout.pinned(counts[None, None]), layout.pinned(indices[None, None])


def _flex_host_index(layout: AttentionLayout) -> tuple[torch.Tensor, ...]:
    """Per token: which sequence it belongs to, and its segment (0 = prefix, k+1 = item k); per query
    block: its key blocks. Built on the packing thread; the device thread only copies them over."""
    doc = torch.cat([torch.full((n,), i, dtype=torch.int32) for i, n in enumerate(layout.seq_lens)])
    seg = torch.cat([segment_ids(p, items) for p, items in zip(layout.prefix_lens, layout.item_lens)])
    return (layout.pinned(doc), layout.pinned(seg), *_flex_kv_blocks(layout))


_HOST_INDEX_BUILDERS: dict[str, Callable[[AttentionLayout], object]] = {
    "cascade": _cascade_host_index,
    "flex": _flex_host_index,
}


def _host_index(layout: AttentionLayout, backend: str) -> Any:
    """The CPU index built at packing time, or now if the layout was never prepared."""
    return layout.cached(f"{backend}_host", lambda: _HOST_INDEX_BUILDERS[backend](layout))


_compiled_flex: Callable | None = None


def _flex_kernel() -> Callable:
    """Compiled once per process on CUDA (the fused kernel); eager elsewhere, for correctness checks."""
    global _compiled_flex
    if _compiled_flex is None:
        from torch.nn.attention.flex_attention import flex_attention

        _compiled_flex = (
            torch.compile(flex_attention, dynamic=True) if torch.cuda.is_available() else flex_attention
        )
    return _compiled_flex


@functools.cache
def _soft_cap_score_mod(cap: float) -> Callable:
    """One score_mod per cap value, so the compiled kernel is reused instead of retraced per layer."""

    def capped(score, batch, head, q_idx, kv_idx):
        return torch.tanh(score / cap) * cap

    return capped


def flex_attention_backend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: AttentionLayout,
    scale: float,
    softcap: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """FlexAttention with a block-sparse mask: the CUDA path whose cost follows the mask.

    Flex applies `scale` before the score_mod, so the cap sees the same scores as Gemma 2's eager code.
    """
    if window is not None and max(layout.seq_lens) > window:
        return dense_attention(q, k, v, layout, scale, softcap, window)
    block_mask = layout.cached("flex_block_mask", lambda: _flex_block_mask(layout))
    out = _flex_kernel()(
        q[None],
        k[None],
        v[None],
        score_mod=None if softcap is None else _soft_cap_score_mod(softcap),
        block_mask=block_mask,
        scale=scale,
        enable_gqa=q.shape[0] != k.shape[0],
    )
    return out[0]


BACKENDS: dict[str, Backend] = {
    "dense": dense_attention,
    "cascade": cascade_attention,
    "flex": flex_attention_backend,
}


def scorer_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """transformers attention-registry entry point: [1, H, T, d] in, [1, T, H, d] out."""
    layout = kwargs.get(LAYOUT_KWARG)
    if not isinstance(layout, AttentionLayout):
        raise RuntimeError(
            f"attention {ATTENTION_IMPLEMENTATION!r} needs the `{LAYOUT_KWARG}` forward kwarg; "
            "this model's forward does not pass attention kwargs through"
        )
    if kwargs.get("s_aux") is not None:
        # Attention sinks would need their own maths; refusing beats a wrong score.
        raise NotImplementedError("attention with `s_aux` (attention sinks) is not supported")
    scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    softcap = kwargs.get("softcap")
    # A layer that names its window (Gemma 2, Qwen 2/3: None on full-attention layers) is believed over
    # the model-wide one, which only serves layers that say nothing.
    window = kwargs.get("sliding_window", layout.sliding_window)
    out = BACKENDS[layout.backend](
        query[0],
        key[0],
        value[0],
        layout,
        scale,
        float(softcap) if softcap else None,
        int(window) if window else None,
    )
    return out.transpose(0, 1).unsqueeze(0), None


def register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_IMPLEMENTATION, scorer_attention)
