"""Deterministic mode's projections on CUDA as one Triton matmul whose every row block is computed alike.

Deterministic mode pads the token stream to whole `ROWS`-row blocks and needs each block's product with
a weight to have the same bits whatever the number of blocks (`engine/layers/invariant.py`). cuBLAS
chooses its kernel (tiles, split-K) by the whole shape, so CUDA runs one `F.linear` per block today: the
same shape every call, at the price of a launch per block (about 14,000 for a 16,384-token forward of a
0.6B decoder). Here one launch computes every block, with one tile configuration fixed in the code for
each dtype, never autotuned and never chosen by the row count: a program owns a `ROWS`-row block and a
`BLOCK_N`-column slice, walks the inner dimension in `BLOCK_K` steps in one order, accumulates in
float32 with no split of the inner dimension, and adds the bias at the end. A row's result then depends
only on its block's rows and the weight: the grid grows with the blocks, no program's arithmetic does.

float32 inputs multiply in IEEE float32 (no tf32), as `F.linear` does by default. Under triton's
interpreter 16-bit tiles are widened to float32 before the product (its bfloat16 dot multiplies raw
bits), so there the accumulation differs from the GPU's in rounding, not in order. Whether it is faster
than the per-block calls is for the GPU: `python -m kafka_scorer_bench.fixed_matmul` times the three
strategies and checks each one's bits at every block count.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kafka_scorer.engine.kernels.label_scores_triton import (
    _OPTIONS,
    _on_device,
    _require_device,
    interpreting,
)


@triton.jit
def _rows_matmul(
    x_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    HAS_BIAS: tl.constexpr,
    F32_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """out[rows, cols] = x[rows] · w[cols]ᵀ (+ b[cols]) for one block of rows and one slice of columns.

    The row count is a multiple of BLOCK_M, so rows need no mask; columns and the inner dimension do."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    inner = tl.arange(0, BLOCK_K)
    col_ok = cols < N
    x_tile = x_ptr + rows[:, None] * stride_xm + inner[None, :]
    w_tile = w_ptr + cols[None, :].to(tl.int64) * stride_wn + inner[:, None]  # [BLOCK_K, BLOCK_N] of wᵀ
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + inner) < K
        x = tl.load(x_tile + k0, mask=k_ok[None, :], other=0.0)
        w = tl.load(w_tile + k0, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        if F32_DOT:
            acc = tl.dot(x.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, w, acc)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + rows[:, None] * stride_om + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=col_ok[None, :])


def tile_config(dtype: torch.dtype) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps, num_stages): one per dtype, fixed, so every process and every block
    count computes alike. Not timed (no GPU was lent when this was written): the usual H100 shapes for a
    128-row tile, float32's smaller in the inner dimension (IEEE products run on the FMA units)."""
    if dtype == torch.float32:
        return 64, 32, 8, 2
    return 128, 64, 8, 3


def rows_matmul(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, block_m: int
) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for x [T, in] with T a multiple of `block_m`, in one launch."""
    rows, inner = x.shape
    if rows % block_m:
        raise ValueError(f"rows_matmul: {rows} rows is not a multiple of {block_m}")
    _require_device(x, "the fixed-rows matmul's launches")
    x, weight = (t if t.stride(-1) == 1 else t.contiguous() for t in (x, weight))
    outputs = weight.shape[0]
    out = torch.empty((rows, outputs), dtype=x.dtype, device=x.device)
    block_n, block_k, warps, stages = tile_config(x.dtype)
    f32_dot = x.dtype == torch.float32 or interpreting()
    grid = (rows // block_m, triton.cdiv(outputs, block_n))
    with _on_device(x):
        _rows_matmul[grid](
            *(x, weight, bias if bias is not None else x, out),
            *(outputs, inner, x.stride(0), weight.stride(0), out.stride(0)),
            HAS_BIAS=bias is not None,
            F32_DOT=f32_dot,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            BLOCK_K=block_k,
            num_warps=warps,
            num_stages=stages,
            **_OPTIONS,
        )
    return out
