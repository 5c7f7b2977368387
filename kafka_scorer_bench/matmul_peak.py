"""The matmul peak a run's compute floor is measured against, taken in the same process and dtype.

The compute floor of a run is 2 × matmul parameters × tokens FLOPs over this peak (attention FLOPs
excluded): floor fraction = floor time / measured time. Measuring the peak here, rather than quoting a
datasheet, keeps the fraction honest about this machine, this dtype and this torch build.
"""

from __future__ import annotations

import torch

from kafka_scorer_bench.models import ModelShape
from kafka_scorer_bench.probes import fastest_call


def gemm_rate(
    shape: tuple[int, int, int], device: torch.device, dtype: torch.dtype, repeats: int, warm: int = 2
) -> float:
    """FLOP/s of the fastest of `repeats` `[m, k] @ [k, n]` products in `dtype`: the GEMM probe that the
    compute floor (here) and the bf16 floor (`precision_floor.py`) are read against."""
    m, k, n = shape
    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    fastest_s, _ = fastest_call(lambda: torch.mm(a, b), device, repeats, warm)
    return 2 * m * k * n / fastest_s


def measure_matmul_peak(device: torch.device, dtype: torch.dtype, shape: ModelShape, quick: bool) -> dict:
    """The best FLOP rate of a few matmuls: a square one and the model's own MLP shape.

    Best-of-many, not the mean: on a shared machine a disturbed repeat only ever reads slower, and a
    peak read too low would make every compute floor look better than it is.
    """
    gpu = device.type == "cuda"
    if quick:
        shapes, repeats = [(256, 256, 256)], 2
    else:
        n, rows = (8192, 16384) if gpu else (2048, 4096)
        shapes = [(n, n, n), (rows, shape.hidden_size, shape.intermediate_size)]
        repeats = 30 if gpu else 10
    best: dict = {"flops_per_s": 0.0}
    for mkn in shapes:
        rate = gemm_rate(mkn, device, dtype, repeats)
        if rate > best["flops_per_s"]:
            best = {"shape": list(mkn), "flops_per_s": rate}
    best["dtype"] = str(dtype).removeprefix("torch.")
    best["repeats"] = repeats
    return best
