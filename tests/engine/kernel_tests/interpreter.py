"""Running a Triton kernel's cases under its interpreter, in one subprocess for all of them.

Triton 3.x reads TRITON_INTERPRET when `triton` is first imported, so the variable cannot be switched
on inside the test process: the inputs go to a script of this folder by `torch.save`, the script runs
the kernel with TRITON_INTERPRET=1 and saves what it computed, and the tests compare that with their
reference. One subprocess per test module: triton and torch import once, not per case.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).parent


def run_interpreted(script: str, payload: dict, tmp: Path) -> dict:
    """`script` (a file of this folder) run over `payload` under the interpreter; what it saved."""
    torch.save(payload, tmp / "in.pt")
    root = str(HERE.parents[2])  # the child imports kafka_scorer from this checkout, installed or not
    pythonpath = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": pythonpath, **row_invariant_blas()}
    proc = subprocess.run(
        [sys.executable, str(HERE / script), str(tmp / "in.pt"), str(tmp / "out.pt")],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(tmp / "out.pt")


def row_invariant_blas() -> dict[str, str]:
    """The interpreter computes `tl.dot` with numpy's matmul, that is OpenBLAS, whose AVX2 kernels
    (Haswell, Zen) give a row other bits when it sits elsewhere in the matrix: on an AMD EPYC without
    AVX-512 every row of a 16x32 @ 32x16 product moved when the rows were rolled. The GPU's tile dot,
    which the interpreter stands in for, keeps a row's result to the row (tests/cuda_tests checks that
    on a GPU), so the bit-identity tests would fail on such a CPU for the stand-in's sake. OpenBLAS's
    Sandy Bridge kernel keeps rows apart (0 of 63 placements moved), so the interpreter runs on it on
    x86-64 unless OPENBLAS_CORETYPE is set already."""
    if platform.machine().lower() not in ("x86_64", "amd64") or "OPENBLAS_CORETYPE" in os.environ:
        return {}
    return {"OPENBLAS_CORETYPE": "Sandybridge"}


def count_span_kernel_launches() -> list[int]:
    """In an interpreted script: wrap the span kernel's launcher so that every launch is counted; the
    returned one-element list holds the count (proof that the kernel, not a torch fallback, ran)."""
    import kafka_scorer.engine.kernels.span_attention_triton as kernel

    launched = [0]
    run = kernel.span_attention

    def counted(*args, **kwargs):
        launched[0] += 1
        return run(*args, **kwargs)

    kernel.span_attention = counted
    return launched
