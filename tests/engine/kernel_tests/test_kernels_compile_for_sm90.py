"""The Triton kernels compile for an H100 (sm_90) at the shapes the engine launches, checked without a
GPU: `_compile_span_kernel.py`, `_compile_fixed_rows_matmul.py` and `_compile_label_kernels.py` run
`triton.compile` ahead of time in a subprocess. The interpreter tests check the maths; this checks what
only the compiler rejects (a global that is not a constexpr passed the interpreter and failed here),
that 16-bit tiles run on the tensor cores, and that nothing spills. Whether they are fast is for
`./dev gpu-check`. Where torch comes from the package index, the floors tier runs them on torch 2.11's
triton 3.6, the GPU machines' own."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def _ptxas_bundled() -> bool:
    spec = importlib.util.find_spec("triton")
    if spec is None or spec.origin is None:
        return False
    return (Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "ptxas").exists()


def _compile(script: str) -> list[dict]:
    """The JSON lines `script` (a file of this folder) printed, run without the interpreter."""
    root = str(HERE.parents[2])
    pythonpath = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, str(HERE / script)],
        env={**env, "PYTHONPATH": pythonpath},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


@pytest.mark.skipif(not _ptxas_bundled(), reason="needs triton's CUDA backend and its bundled ptxas")
def test_span_kernel_compiles_to_a_cubin_for_sm90() -> None:
    reports = _compile("_compile_span_kernel.py")
    assert [(r["dtype"], r["head_dim"]) for r in reports] == [
        ("bf16", 128),
        ("fp16", 64),
        ("bf16", 256),
        ("fp32", 16),
    ]
    assert all(r["cubin_bytes"] > 0 for r in reports)
    # 16-bit tiles run on the H100's tensor cores (warpgroup MMA), not a fallback
    assert all(r["wgmma"] for r in reports if r["dtype"] != "fp32")


@pytest.mark.skipif(not _ptxas_bundled(), reason="needs triton's CUDA backend and its bundled ptxas")
def test_fixed_rows_matmul_compiles_without_spills_for_sm90() -> None:
    """Deterministic mode's fixed-tile matmul (engine/kernels/fixed_rows_matmul_triton.py), every dtype,
    with and without a bias: a cubin, no local memory (spills), 16-bit tiles on warpgroup MMA."""
    reports = _compile("_compile_fixed_rows_matmul.py")
    assert [(r["dtype"], r["bias"]) for r in reports] == [
        (dtype, bias) for dtype in ("bf16", "fp16", "fp32") for bias in (False, True)
    ]
    assert all(r["cubin_bytes"] > 0 and r["local"] == 0 and 0 < r["reg"] <= 255 for r in reports)
    assert all(r["wgmma"] for r in reports if r["dtype"] != "fp32")


@pytest.mark.skipif(not _ptxas_bundled(), reason="needs triton's CUDA backend and its bundled ptxas")
def test_label_kernels_compile_without_spills_for_sm90() -> None:
    """The label kernels, CUDA's default for CausalLM label scores (engine/kernels/label_scores_triton.py):
    the streamed log-sum-exp at every autotune candidate, in float32, with a bias and soft-capping, and
    the label-row dots; a cubin each, no local memory (spills), 16-bit tiles on warpgroup MMA."""
    reports = _compile("_compile_label_kernels.py")
    lse = [r for r in reports if r["kernel"] == "lse"]
    assert [(r["dtype"], r["config"], r["extras"]) for r in lse] == [
        *(("bf16", index, False) for index in range(5)),
        ("fp32", 0, False),
        ("bf16", 0, True),
    ]
    assert [r["labels"] for r in reports if r["kernel"] == "dots"] == [2, 16]
    assert all(r["cubin_bytes"] > 0 and r["local"] == 0 and 0 < r["reg"] <= 255 for r in reports)
    assert all(r["wgmma"] for r in lse if r["dtype"] == "bf16")
