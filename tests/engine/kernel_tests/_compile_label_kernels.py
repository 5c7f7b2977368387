"""Compiles the Triton label kernels (the CUDA default for CausalLM label scores) for an H100 (sm_90)
ahead of time, without a GPU.

As `_compile_span_kernel.py` does for the span kernel: `triton.compile` lowers each through Triton's GPU
passes, LLVM and ptxas to a cubin, in a process of its own, and prints one JSON line per variant for the
parent test: the streamed log-sum-exp in bfloat16 at every autotune candidate (the tuner may pick any),
in float32, and with a bias and soft-capping (Gemma 2); and the label-row dots.
"""

from __future__ import annotations

import json
import sys

from _compile_fixed_rows_matmul import resources


def lse_variants(configs: list) -> list[tuple[str, int, bool]]:
    """(dtype, autotune candidate, bias and soft-cap): bfloat16 at every candidate (float16 lowers the
    same way), float32 at the first, and bfloat16 with a bias and soft-capping."""
    return [*(("bf16", index, False) for index in range(len(configs))), ("fp32", 0, False), ("bf16", 0, True)]


def main() -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kafka_scorer.engine.kernels.label_scores_triton import (
        _GPU_CONFIGS,
        _OPTIONS,
        _label_dots,
        _lse_partials,
        dots_tiles,
    )

    target = GPUTarget("cuda", 90, 32)
    for dtype, index, extras in lse_variants(_GPU_CONFIGS):
        config = _GPU_CONFIGS[index]
        flags = {"HAS_BIAS": extras, "HAS_SOFTCAP": extras, "F32_DOT": dtype == "fp32", **config.kwargs}
        types = {"h_ptr": f"*{dtype}", "w_ptr": f"*{dtype}", "b_ptr": f"*{dtype}", "out_ptr": "*fp32"}
        types["softcap"] = "fp32"
        signature = {
            arg: "constexpr" if arg in flags else types.get(arg, "i32") for arg in _lse_partials.arg_names
        }
        options = {"num_warps": config.num_warps, "num_stages": config.num_stages, **_OPTIONS}
        kernel = triton.compile(
            ASTSource(_lse_partials, signature, constexprs=flags), target=target, options=options
        )
        report(kernel, kernel="lse", dtype=dtype, config=index, extras=extras)
    for labels in (2, 16):  # yes/no, and a many-label classifier prompt, at Qwen3-0.6B's hidden size
        block_l, block_k = dots_tiles(labels, 1024)
        flags = {"HAS_BIAS": True, "BLOCK_L": block_l, "BLOCK_K": block_k}
        types = {"h_ptr": "*bf16", "w_ptr": "*bf16", "b_ptr": "*bf16", "ids_ptr": "*i64", "out_ptr": "*fp32"}
        signature = {
            arg: "constexpr" if arg in flags else types.get(arg, "i32") for arg in _label_dots.arg_names
        }
        kernel = triton.compile(
            ASTSource(_label_dots, signature, constexprs=flags), target=target, options=_OPTIONS
        )
        report(kernel, kernel="dots", dtype="bf16", labels=labels)


def report(compiled, **what) -> None:
    cubin = compiled.asm.get("cubin", b"")
    found = {
        **what,
        "cubin_bytes": len(cubin),
        **resources(cubin),
        "wgmma": "wgmma" in compiled.asm.get("ptx", ""),
    }
    print(json.dumps(found), flush=True)


if __name__ == "__main__":
    sys.exit(main())
