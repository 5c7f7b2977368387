"""Compiles the span kernel for an H100 (sm_90) ahead of time, without a GPU, in a process of its own.

`triton.compile` lowers the kernel through Triton's GPU passes, LLVM and ptxas (bundled with triton's
wheel) to a cubin without touching a device: what the interpreter cannot check (constexpr globals,
shapes `tl.dot` accepts on tensor cores, control flow the compiler can lower). Its own process: the
pytest process must not import triton (cli/no_triton.py tests look for it), nor run it interpreted.
Prints one JSON line per shape; the parent test checks them.
"""

from __future__ import annotations

import json
import sys

SHAPES = [  # (dtype, head_dim, soft cap): what the engine launches for the models it serves
    ("bf16", 128, False),  # Qwen3
    ("fp16", 64, False),
    ("bf16", 256, True),  # Gemma 2
    ("fp32", 16, True),  # the CUDA tier's float32 tiny models: IEEE products
]


def main() -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kafka_scorer.engine.attention.spans import BLOCK_M
    from kafka_scorer.engine.kernels.span_attention_triton import _OPTIONS, _span_attention, launch_shape

    pointers = ("q_ptr", "k_ptr", "v_ptr", "o_ptr")
    ids = ("doc_ptr", "seg_ptr", "offsets_ptr", "starts_ptr", "ends_ptr")
    for dtype, head_dim, softcap in SHAPES:
        block_d, block_n, warps, stages = launch_shape(head_dim)
        constexprs = {
            "HAS_SOFTCAP": softcap,
            "F32_DOT": dtype == "fp32",
            "BLOCK_M": BLOCK_M,
            "BLOCK_N": block_n,
            "BLOCK_D": block_d,
        }
        signature = {}
        for name in _span_attention.arg_names:
            if name in constexprs:
                signature[name] = "constexpr"
            elif name in pointers:
                signature[name] = f"*{dtype}"
            elif name in ids:
                signature[name] = "*i32"
            else:
                signature[name] = "fp32" if name in ("scale", "softcap") else "i32"
        kernel = triton.compile(
            ASTSource(fn=_span_attention, signature=signature, constexprs=constexprs),
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": warps, "num_stages": stages, **_OPTIONS},
        )
        cubin = kernel.asm.get("cubin", b"")
        report = {"dtype": dtype, "head_dim": head_dim, "softcap": softcap, "cubin_bytes": len(cubin)}
        print(json.dumps({**report, "wgmma": "wgmma" in kernel.asm.get("ptx", "")}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
