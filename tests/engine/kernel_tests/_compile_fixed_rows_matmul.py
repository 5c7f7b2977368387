"""Compiles deterministic mode's fixed-tile matmul for an H100 (sm_90) ahead of time, without a GPU.

As `_compile_span_kernel.py` does for the span kernel: `triton.compile` lowers it through Triton's GPU
passes, LLVM and ptxas to a cubin, in a process of its own, and prints one JSON line per dtype (with
and without a bias) for the parent test.
"""

from __future__ import annotations

import json
import sys

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def main() -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kafka_scorer.engine.kernels.fixed_rows_matmul_triton import _OPTIONS, _rows_matmul, tile_config
    from kafka_scorer.engine.layers.invariant import ROWS

    pointers = ("x_ptr", "w_ptr", "b_ptr", "out_ptr")
    for name, dtype in DTYPES.items():
        for bias in (False, True):
            block_n, block_k, warps, stages = tile_config(dtype)
            constexprs = {
                "HAS_BIAS": bias,
                "F32_DOT": dtype == torch.float32,
                "BLOCK_M": ROWS,
                "BLOCK_N": block_n,
                "BLOCK_K": block_k,
            }
            signature = {
                arg: "constexpr" if arg in constexprs else f"*{name}" if arg in pointers else "i32"
                for arg in _rows_matmul.arg_names
            }
            kernel = triton.compile(
                ASTSource(fn=_rows_matmul, signature=signature, constexprs=constexprs),
                target=GPUTarget("cuda", 90, 32),
                options={"num_warps": warps, "num_stages": stages, **_OPTIONS},
            )
            cubin = kernel.asm.get("cubin", b"")
            report = {"dtype": name, "bias": bias, "cubin_bytes": len(cubin), **resources(cubin)}
            print(json.dumps({**report, "wgmma": "wgmma" in kernel.asm.get("ptx", "")}), flush=True)


def resources(cubin: bytes) -> dict:
    """Registers and local memory (spills) per thread, from the cuobjdump bundled with triton's wheel."""
    import re
    import subprocess
    import tempfile
    from pathlib import Path

    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        usage = subprocess.run([str(tool), "-res-usage", file.name], capture_output=True, text=True).stdout
    found = {key: re.search(rf"\b{key}:(\d+)", usage) for key in ("REG", "LOCAL")}
    return {key.lower(): int(match.group(1)) if match else None for key, match in found.items()}


if __name__ == "__main__":
    sys.exit(main())
