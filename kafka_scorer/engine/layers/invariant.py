"""Matmuls whose every row is computed the same way whatever the number of rows around it.

A BLAS (or cuBLAS) matmul picks its kernel and blocking from the shape, M included, so one token's
projection differs in the last bits between a forward of 300 tokens and one of 3,000 (measured on the
CPU: one row of `F.linear` matched itself in 1 of 22 (M, position) cases). Run at one fixed shape, the
same kernel serves every row, and a row's result no longer depends on its batch-mates or on where it
sits in the stream (22 of 22). So in deterministic mode the token stream is padded to a multiple of
`ROWS` and every projection runs as `ROWS`-row blocks: one batched matmul over a stride-0 view of the
weight on the CPU (as fast as the plain matmul, measured), one fixed-shape matmul per block on CUDA.
A third strategy, one Triton launch with a fixed tile per block (`linear_triton_blocks`), is measured
beside them on the GPU (`kafka_scorer_bench/fixed_matmul.py`) before CUDA takes it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

ROWS = 128
"""Rows of every fixed-shape block (a multiple of the widest CPU vector, so no elementwise op over a
padded stream ever runs a scalar tail that its vector body would round differently)."""


def padded_length(tokens: int, multiple: int = ROWS) -> int:
    """`tokens` rounded up to a whole number of blocks (at least one)."""
    return max(multiple, -(-tokens // multiple) * multiple)


def pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """`x` with zero rows appended up to `rows` along its first dimension."""
    missing = rows - x.shape[0]
    if missing <= 0:
        return x
    return torch.cat([x, x.new_zeros((missing, *x.shape[1:]))])


def fixed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for x [T, in] with T a multiple of `ROWS`, by fixed-shape blocks."""
    if x.shape[0] % ROWS:
        raise ValueError(f"fixed_linear: {x.shape[0]} rows is not a multiple of {ROWS}")
    if x.device.type != "cpu":
        return linear_per_block(x, weight, bias)
    return linear_batched_blocks(x, weight, bias)


def linear_per_block(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """One `F.linear` per block: the same call, hence the same kernel, for every block on any device
    (off the CPU a batched call may pick its kernel by the batch count: unmeasured so far, see
    `kafka_scorer_bench/fixed_matmul.py`), at the price of a launch per block."""
    return torch.cat([F.linear(block, weight, bias) for block in x.split(ROWS)])


def linear_triton_blocks(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """All blocks in one Triton launch whose tile configuration is fixed in the code, never chosen by
    the row count (`kernels/fixed_rows_matmul_triton.py`): the same arithmetic for every block by
    construction. CUDA (or triton's interpreter) only; whether it beats a launch per block is for the
    GPU to say (`kafka_scorer_bench/fixed_matmul.py`), so `fixed_linear` does not take it yet."""
    from kafka_scorer.engine.kernels.fixed_rows_matmul_triton import rows_matmul

    return rows_matmul(x, weight, bias, ROWS)


def linear_batched_blocks(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """All blocks in one batched matmul over a stride-0 view of the weight: as fast as the plain matmul
    on the CPU, where every block count gives each block the same bits (measured, but for one output
    column: `_one_output`)."""
    if weight.shape[0] == 1:
        return _one_output(x, weight, bias)
    tokens, width = x.shape
    blocks = x.reshape(-1, ROWS, width)
    weights = weight.t()[None].expand(blocks.shape[0], *weight.t().shape)
    if bias is None:
        return torch.bmm(blocks, weights).reshape(tokens, -1)
    # the bias inside the batched matmul, as addmm has it: a separate add was a quarter of a MiniLM
    # projection's time (384 -> 1,536 over 6,144 rows: addmm 90 ms, bmm + add 114, baddbmm 94)
    start = bias[None, None].expand(blocks.shape[0], ROWS, bias.shape[0])
    return torch.baddbmm(start, blocks, weights).reshape(tokens, -1)


def _one_output(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """A one-output projection (a one-label classifier) by batched blocks, its weight padded to two.

    The CPU's batched matmul takes another kernel for a single output column when there is more than
    one block, so a block's result differed between one block and several (measured: every block count
    from 2 to 12 against 1, every width tried); with two columns every count agrees."""
    weight = torch.cat([weight, weight.new_zeros(weight.shape)])
    bias = None if bias is None else torch.cat([bias, bias.new_zeros(bias.shape)])
    return linear_batched_blocks(x, weight, bias)[:, :1]


class FixedRowsLinear(nn.Linear):
    """An `nn.Linear` of a stock (transformers) module that computes by `fixed_linear`'s blocks.

    The encoders of deterministic mode keep transformers' own layers, so their projections are swapped
    in place (`fix_linears`); the input's rows are padded to whole blocks here, since a stock layer may
    also project a handful of rows (BERT's pooler reads one token per pair)."""

    @classmethod
    def over(cls, linear: nn.Linear) -> FixedRowsLinear:
        """The same weight and bias (shared, not copied), computed by fixed-shape blocks."""
        fixed = cls.__new__(cls)
        nn.Module.__init__(fixed)
        fixed.in_features, fixed.out_features = linear.in_features, linear.out_features
        fixed.weight, fixed.bias = linear.weight, linear.bias
        return fixed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        count = rows.shape[0]
        out = fixed_linear(pad_rows(rows, padded_length(count)), self.weight, self.bias)[:count]
        return out.reshape(*x.shape[:-1], out.shape[-1])


def fix_linears(module: nn.Module) -> None:
    """Every `nn.Linear` under `module` computed by fixed-shape blocks, swapped in place."""
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, FixedRowsLinear.over(child))
