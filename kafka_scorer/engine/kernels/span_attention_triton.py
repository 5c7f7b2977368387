"""MIS attention in Triton that walks each query tile's own key spans (the `spans` backend's kernel).

One program per (query tile, head). The tile's queries `[BLOCK_M, D]` stay in registers; the program
loops over the tile's key spans (`engine/attention/spans.py` lists them: exactly the keys some token of
the tile may see), and within a span over chunks of `BLOCK_N` keys that start at the span's first key.
Each chunk's scores are formed in float32 (`tl.dot`, fp32 accumulate), scaled, soft-capped when asked
(Gemma 2: `cap · tanh(s / cap)`, before the mask), masked by the SPEC §5 rule from per-token ids (same
sequence, key <= query, key in the prefix or in the query's own item) and folded into a running max
and sum (online softmax), so no score matrix ever reaches memory.

GQA: query head h reads key/value head `h // (H // Hkv)`. The head dimension is padded to a power of
two >= 16 (`tl.dot`'s smallest operand) with masked loads: tiny test models use 16, Qwen3 128, Gemma 2
256.

Block sizes, warps and stages are the usual H100 flash-attention choices, NOT timed: this kernel was
written without a GPU. Its maths is tested under TRITON_INTERPRET=1, its lowering by compiling it for
sm_90 ahead of time (tests/engine/kernel_tests/test_kernels_compile_for_sm90.py: the 16-bit tiles use
warpgroup MMA), and `launch_shape` avoids the register spills that compile showed. `gpu_check` times
the backend next to flex and cascade.

float32 inputs multiply in IEEE float32 (no tf32: the CPU tier compares at 1e-5). Under the interpreter
bfloat16 tiles are widened to float32 first (triton 3.9's interpreter multiplies bfloat16 as raw bits),
so there the probabilities stay float32 where the GPU casts them to the values' dtype for the second
product.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kafka_scorer.engine.kernels.label_scores_triton import (
    _OPTIONS,
    _on_device,
    _require_device,
    _soft_cap,
    interpreting,
)

LOG2E = tl.constexpr(1.4426950408889634)  # a global a kernel reads must be a constexpr


# T only bounds the masks: specialising on its divisibility would compile a second variant on the first
# live batch whose token count falls in the other class (a compile in service).
@triton.jit(do_not_specialize=["T"])
def _span_attention(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    doc_ptr,
    seg_ptr,
    offsets_ptr,
    starts_ptr,
    ends_ptr,
    T,
    head_dim,
    group,
    stride_qh,
    stride_qt,
    stride_kh,
    stride_kt,
    stride_vh,
    stride_vt,
    stride_oh,
    stride_ot,
    scale,
    softcap,
    HAS_SOFTCAP: tl.constexpr,
    F32_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Queries [tile·BLOCK_M, +BLOCK_M) of one head against the tile's spans -> their output rows.

    Scalar int64 bases, int32 offsets inside a tile: H·T·d passes 2**31 for large batches, one tile
    never does."""
    tile = tl.program_id(0)
    head = tl.program_id(1)
    m0 = tile * BLOCK_M
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    queries = m0 + rows
    m_ok = queries < T
    d_ok = dims < head_dim

    q_block = q_ptr + head.to(tl.int64) * stride_qh + m0.to(tl.int64) * stride_qt
    q_mask = m_ok[:, None] & d_ok[None, :]
    q = tl.load(q_block + rows[:, None] * stride_qt + dims[None, :], mask=q_mask, other=0.0)
    # Rows past T belong to no sequence (-1) and match no key (-2 below): they stay empty.
    doc_q = tl.load(doc_ptr + queries, mask=m_ok, other=-1)
    seg_q = tl.load(seg_ptr + queries, mask=m_ok, other=-1)

    kv_head = (head // group).to(tl.int64)
    k_head = k_ptr + kv_head * stride_kh
    v_head = v_ptr + kv_head * stride_vh

    run_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    run_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    first_span = tl.load(offsets_ptr + tile)
    last_span = tl.load(offsets_ptr + tile + 1)
    for span in range(first_span, last_span):
        lo = tl.load(starts_ptr + span)
        hi = tl.load(ends_ptr + span)
        # int64 base per span; offsets inside it are bounded by a span (about one sequence), not by T.
        k_span = k_head + lo.to(tl.int64) * stride_kt
        v_span = v_head + lo.to(tl.int64) * stride_vt
        for c0 in range(0, hi - lo, BLOCK_N):
            chunk = c0 + cols
            keys = lo + chunk
            n_ok = keys < hi
            kv_mask = n_ok[:, None] & d_ok[None, :]
            k = tl.load(k_span + chunk[:, None] * stride_kt + dims[None, :], mask=kv_mask, other=0.0)
            v = tl.load(v_span + chunk[:, None] * stride_vt + dims[None, :], mask=kv_mask, other=0.0)
            doc_k = tl.load(doc_ptr + keys, mask=n_ok, other=-2)
            seg_k = tl.load(seg_ptr + keys, mask=n_ok, other=-2)
            if F32_DOT:
                s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            s = s * scale
            if HAS_SOFTCAP:
                s = _soft_cap(s, softcap)
            own = (seg_k[None, :] == 0) | (seg_k[None, :] == seg_q[:, None])
            allowed = (doc_k[None, :] == doc_q[:, None]) & (keys[None, :] <= queries[:, None]) & own
            s = tl.where(allowed, s, float("-inf"))
            new_max = tl.maximum(run_max, tl.max(s, axis=1))
            # Shift by 0 while a row has seen no key: -inf - -inf would be nan.
            shift = tl.where(new_max == float("-inf"), 0.0, new_max)
            alpha = tl.exp2((run_max - shift) * LOG2E)
            p = tl.exp2((s - shift[:, None]) * LOG2E)
            run_sum = run_sum * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None]
            if F32_DOT:
                acc = tl.dot(p, v.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(p.to(v.dtype), v, acc)
            run_max = new_max

    # A row that saw no key (padding past T only: every real token sees itself) has acc 0 and sum 0.
    out = acc / tl.where(run_sum > 0.0, run_sum, 1.0)[:, None]
    o_block = o_ptr + head.to(tl.int64) * stride_oh + m0.to(tl.int64) * stride_ot
    tl.store(o_block + rows[:, None] * stride_ot + dims[None, :], out.to(o_ptr.dtype.element_ty), mask=q_mask)


def launch_shape(head_dim: int) -> tuple[int, int, int, int]:
    """(BLOCK_D, BLOCK_N, num_warps, num_stages) for a head dimension; BLOCK_M is the metadata's tile.

    Not timed (no GPU was lent when this was written). Chosen as the usual H100 flash-attention forward
    shapes, then checked by compiling for sm_90 ahead of time (`triton.compile`, no device needed) and
    reading the cubin's resource use: with 64-key chunks, 4 warps and 3 stages d = 128 needed 255
    registers and spilled; 2 stages fit in 208 without spilling. At d = 256 the q tile and the
    accumulator are twice as large: 32-key chunks and 8 warps fit without spilling."""
    block_d = max(16, triton.next_power_of_2(head_dim))
    if block_d <= 64:
        return block_d, 64, 4, 3
    if block_d <= 128:
        return block_d, 64, 4, 2
    return block_d, 32, 8, 2


def span_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    documents: torch.Tensor,
    segments: torch.Tensor,
    span_offsets: torch.Tensor,
    span_starts: torch.Tensor,
    span_ends: torch.Tensor,
    scale: float,
    softcap: float | None,
    block_m: int,
    block_n: int | None = None,
) -> torch.Tensor:
    """q [H, T, d], k/v [Hkv, T, d] (any strides with unit last stride; others are copied once) ->
    [H, T, d] in q's dtype, laid out as [T, H, d] so the caller's transpose back is free.

    `span_offsets` must list `ceil(T / block_m)` tiles (`SpanMetadata`); `block_n` pins the key chunk
    (tests use it to cut spans into ragged chunks)."""
    heads, total, head_dim = q.shape
    kv_heads = k.shape[0]
    if heads % kv_heads:
        raise ValueError(f"query heads ({heads}) must be a multiple of key/value heads ({kv_heads})")
    tiles = span_offsets.numel() - 1
    if tiles != triton.cdiv(total, block_m):
        raise ValueError(f"span metadata lists {tiles} tiles of {block_m}, the batch has {total} tokens")
    _require_device(q, "the span kernel's launches")
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    out = torch.empty((total, heads, head_dim), dtype=q.dtype, device=q.device).transpose(0, 1)
    block_d, chunk, warps, stages = launch_shape(head_dim)
    f32_dot = q.dtype == torch.float32 or (interpreting() and q.dtype == torch.bfloat16)
    with _on_device(q):
        _span_attention[(tiles, heads)](
            *(q, k, v, out, documents, segments, span_offsets, span_starts, span_ends),
            *(total, head_dim, heads // kv_heads),
            *(q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1)),
            *(out.stride(0), out.stride(1), float(scale), float(softcap or 1.0)),
            HAS_SOFTCAP=bool(softcap),
            F32_DOT=f32_dot,
            BLOCK_M=block_m,
            BLOCK_N=block_n or chunk,
            BLOCK_D=block_d,
            num_warps=warps,
            num_stages=stages,
            **_OPTIONS,
        )
    return out
