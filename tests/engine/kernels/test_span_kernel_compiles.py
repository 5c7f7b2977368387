"""The span kernel compiles for an H100 (sm_90) at the shapes the engine launches, checked without a
GPU: `_compile_span_kernel.py` runs `triton.compile` ahead of time in a subprocess. The interpreter
tests check the maths; this checks what only the compiler rejects (a global that is not a constexpr
passed the interpreter and failed here). Whether it is fast is for `./dev gpu-check`."""

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


@pytest.mark.skipif(not _ptxas_bundled(), reason="needs triton's CUDA backend and its bundled ptxas")
def test_kernel_compiles_to_a_cubin_for_sm90() -> None:
    root = str(HERE.parents[2])
    pythonpath = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, str(HERE / "_compile_span_kernel.py")],
        env={**env, "PYTHONPATH": pythonpath},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    reports = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [(r["dtype"], r["head_dim"]) for r in reports] == [
        ("bf16", 128),
        ("fp16", 64),
        ("bf16", 256),
        ("fp32", 16),
    ]
    assert all(r["cubin_bytes"] > 0 for r in reports)
    # 16-bit tiles run on the H100's tensor cores (warpgroup MMA), not a fallback
    assert all(r["wgmma"] for r in reports if r["dtype"] != "fp32")
