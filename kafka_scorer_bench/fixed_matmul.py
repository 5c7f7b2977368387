"""`python -m kafka_scorer_bench.fixed_matmul`: deterministic mode's projections, per block, batched or
in one fixed-tile Triton launch.

Deterministic mode computes every projection as fixed `ROWS`-row blocks (`engine/layers/invariant.py`),
so a token's result never depends on how many tokens share its forward. On the CPU all blocks go into
one batched matmul over a stride-0 view of the weight, measured to give each block the same bits
whatever the block count. Off the CPU each block is its own `F.linear` call: a launch per block (a
16,384-token forward of the 0.6B shape is 128 blocks × 4 projections × 28 layers, about 14,000
launches), because whether a GPU's batched matmul keeps a block's bits across batch counts has not been
measured. A third strategy computes every block in one Triton launch whose tile is fixed in the code
(`kernels/fixed_rows_matmul_triton.py`), the same arithmetic for every block by construction. This
measures them on the device at hand, on the model shape's four projections: ms per projection for the
plain matmul, the per-block calls, the batched call and (where triton runs) the Triton launch; whether
the batched and the Triton calls give block 0 the same bits at every block count tried; and whether
the batched call agrees with the per-block calls bit for bit (if so, switching would not change a
single score). A GPU session reads it to decide which strategy `fixed_linear` takes on CUDA.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn.functional as F

from kafka_scorer.engine.kernels.runs_on import triton_runs_on
from kafka_scorer.engine.layers.invariant import (
    ROWS,
    linear_batched_blocks,
    linear_per_block,
    linear_triton_blocks,
)
from kafka_scorer_bench.engine_alone import engine_parser, resolve_run, write_report
from kafka_scorer_bench.models import ModelShape
from kafka_scorer_bench.probes import fastest_call

Linear = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


def projections(shape: ModelShape) -> dict[str, tuple[int, int]]:
    """(in, out) features of a decoder layer's projections as the fused forward runs them (q/k/v and
    gate/up merged)."""
    q, kv = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    return {
        "qkv": (shape.hidden_size, q + 2 * kv),
        "o": (q, shape.hidden_size),
        "gate_up": (shape.hidden_size, 2 * shape.intermediate_size),
        "down": (shape.intermediate_size, shape.hidden_size),
    }


def counts_that_differ(linear: Linear, x: torch.Tensor, weight: torch.Tensor, counts: list[int]) -> list[int]:
    """The block counts at which `linear` gives the first block other bits than it gets alone."""
    alone = linear(x[:ROWS], weight, None)
    return [c for c in counts if not torch.equal(linear(x[: c * ROWS], weight, None)[:ROWS], alone)]


def best_ms(
    call: Callable[[], torch.Tensor], device: torch.device, repeats: int
) -> tuple[float, torch.Tensor]:
    """The fastest of `repeats` timed calls (after two untimed), in ms, and the last call's result (what
    the bit-for-bit checks compare, so no strategy runs again for them)."""
    seconds, result = fastest_call(call, device, repeats)
    return seconds * 1e3, result


def probe(
    features: tuple[int, int], tokens: int, device: torch.device, dtype: torch.dtype, repeats: int
) -> dict:
    """One projection at `tokens` rows: the three timings and the two bit-for-bit checks."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, features[0], generator=generator).to(device, dtype)
    weight = (torch.randn(features[1], features[0], generator=generator) / features[0] ** 0.5).to(
        device, dtype
    )
    blocks = tokens // ROWS
    counts = sorted({c for c in (2, 3, 4, 7, 8, 16, 32, blocks) if 1 < c <= blocks})
    plain_ms, plain = best_ms(lambda: F.linear(x, weight), device, repeats)
    per_block_ms, per_block = best_ms(lambda: linear_per_block(x, weight, None), device, repeats)
    batched_ms, batched = best_ms(lambda: linear_batched_blocks(x, weight, None), device, repeats)
    row = {
        "in": features[0],
        "out": features[1],
        "plain_ms": plain_ms,
        "per_block_ms": per_block_ms,
        "batched_ms": batched_ms,
        "counts_checked": counts,
        "batched_counts_differing": counts_that_differ(linear_batched_blocks, x, weight, counts),
        "strategies_agree": torch.equal(per_block, batched),
        "triton_ms": None,
        "triton_counts_differing": None,
        "triton_max_abs_diff": None,
    }
    if triton_runs_on(device):
        row["triton_ms"], triton = best_ms(lambda: linear_triton_blocks(x, weight, None), device, repeats)
        row["triton_counts_differing"] = counts_that_differ(linear_triton_blocks, x, weight, counts)
        row["triton_max_abs_diff"] = float((triton.float() - plain.float()).abs().max())
    return row


def run(args: argparse.Namespace) -> dict:
    run_ = resolve_run(args, "fixed-matmul")
    device, dtype = torch.device(run_.device), getattr(torch, run_.dtype)
    tokens = args.tokens or (4 * ROWS if args.quick else 16384 if device.type == "cuda" else 4096)
    report = {"device": run_.device, "dtype": run_.dtype, "shape": run_.shape.name, "tokens": tokens}
    report["projections"] = {
        name: probe(features, tokens, device, dtype, args.repeats)
        for name, features in projections(run_.shape).items()
    }
    for line in format_table(report):
        print(line, flush=True)
    return report


def format_table(report: dict) -> list[str]:
    """The report as the markdown table docs/performance.md shows."""
    lines = [
        f"{report['shape']} projections at {report['tokens']:,} tokens, {report['dtype']} on "
        f"{report['device']}:",
        "",
        "| projection | in → out | plain ms | per block ms | batched ms | triton ms "
        "| batched: same bits at every count | triton: same bits at every count (max diff vs plain) "
        "| per block == batched |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | --- | --- |",
    ]
    for name, row in report["projections"].items():
        triton = row.get("triton_ms")
        triton_same = "—"
        if triton is not None:
            triton_same = f"{_same_bits(row['triton_counts_differing'])} ({row['triton_max_abs_diff']:.1e})"
        lines.append(
            f"| {name} | {row['in']:,} → {row['out']:,} | {row['plain_ms']:.3f} | "
            f"{row['per_block_ms']:.3f} | {row['batched_ms']:.3f} | "
            f"{'—' if triton is None else f'{triton:.3f}'} | {_same_bits(row['batched_counts_differing'])} | "
            f"{triton_same} | {'yes' if row['strategies_agree'] else 'no'} |"
        )
    return lines


def _same_bits(differing: list[int]) -> str:
    return "yes" if not differing else "no: " + ", ".join(map(str, differing))


def main(argv: list[str] | None = None) -> None:
    parser = engine_parser("python -m kafka_scorer_bench.fixed_matmul", __doc__)
    parser.add_argument("--tokens", type=int, default=None, help="rows per projection (a multiple of 128)")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    write_report(args, run(args))


if __name__ == "__main__":
    main()
