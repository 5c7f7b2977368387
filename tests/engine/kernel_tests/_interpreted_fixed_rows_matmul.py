"""Runs deterministic mode's fixed-tile Triton matmul under triton's interpreter, in a process of its own.

TRITON_INTERPRET must be set before triton's first import, so the parent test
(test_fixed_rows_matmul.py) saves its cases with `torch.save` and runs this script with it set. This file
only runs the code under test and writes back what it computed; the parent checks it.
"""

from __future__ import annotations

import sys

import torch


def main(in_path: str, out_path: str) -> None:
    from kafka_scorer.engine.kernels.runs_on import triton_runs_on
    from kafka_scorer.engine.layers.invariant import ROWS, linear_triton_blocks

    assert triton_runs_on(torch.device("cpu")), "TRITON_INTERPRET=1 must be set before triton is imported"
    results = {}
    for name, case in torch.load(in_path).items():
        x, weight, bias = case["x"], case["weight"], case["bias"]
        blocks = x.shape[0] // ROWS
        swapped = torch.cat([x[ROWS : 2 * ROWS], x[:ROWS], x[2 * ROWS :]])
        results[name] = {
            "full": linear_triton_blocks(x, weight, bias),
            # block 0 computed with 1, 2, ... blocks in the call
            "prefixes": [linear_triton_blocks(x[: n * ROWS], weight, bias)[:ROWS] for n in range(1, blocks)],
            # block 0 computed as the call's second block
            "moved": linear_triton_blocks(swapped, weight, bias)[ROWS : 2 * ROWS],
        }
    try:
        linear_triton_blocks(torch.zeros(ROWS + 1, 8), torch.zeros(4, 8), None)
    except ValueError as exc:
        results["ragged"] = str(exc)
    torch.save(results, out_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
