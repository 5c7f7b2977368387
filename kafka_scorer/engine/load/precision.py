"""What `dtype=auto` runs, and why: the one place that decides a checkpoint's precision.

On CUDA auto is bfloat16 (tensor cores compute it; every kind's GPU path keeps in float32 what
precision needs). On a CPU, bfloat16 pays only where the processor computes it natively (AVX512-BF16 or
AMX: matmuls 2.7-2.9x float32's rate, issue 49); elsewhere torch emulates it, slower than float32, so
auto stays float32. Where it is native, auto runs bfloat16 only for a kind whose rankings held in it
when measured (`BF16_RANKINGS_HOLD`, from tests/engine/fidelity.py; docs/performance.md has the
figures): a kind that failed keeps float32, so auto never trades a ranking a user would notice for
speed. `dtype=float32` / `dtype=bfloat16` / `dtype=float16` force one whatever the kind and processor.

The reason travels to the worker's start-up line (`dtype_reason=`), without spaces, as that line is
`key=value` pairs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch

from kafka_scorer.engine.models.loaded import ModelLoadError

DTYPES: Mapping[str, torch.dtype] = MappingProxyType(
    {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
)

BF16_RANKINGS_HOLD: Mapping[str, bool] = MappingProxyType(
    {
        "cross_encoder": True,
        "late_interaction": True,
        "label_scorer": True,
        "hybrid": False,
        "classifier": True,
        "vision": False,
        "listwise": False,
    }
)
"""Per kind: whether bf16 rankings met the fidelity bar against float32 (tests/engine/fidelity.py:
top-10 overlap, Kendall's tau, largest score difference over generated queries of 100 documents).
tests/engine/test_precision_fidelity.py holds each entry to a fresh measurement. Vision and listwise
are not measured yet (no real-weight checkpoint of theirs ships), so auto keeps them in float32; the
hybrid kind ranked within the bar but its scores moved by 25 % of a query's spread (its recurrent state
accumulates bf16 rounding), so it keeps float32 too."""


@dataclass(frozen=True)
class Precision:
    dtype: torch.dtype
    reason: str
    """Why, in one token: `set` (the operator named it), `auto:cuda`, `auto:cpu-no-native-bf16`,
    `auto:cpu-<feature>+<kind>-rankings-hold` or `auto:cpu-<feature>+<kind>-rankings-differ`."""

    @property
    def name(self) -> str:
        return str(self.dtype).removeprefix("torch.")


def native_bf16_feature() -> str | None:
    """The CPU feature that computes bf16 matmuls natively ("amx_bf16", "avx512_bf16"), as torch itself
    detects it (`torch.cpu`, the checks its oneDNN dispatch uses), or None."""
    cpu = torch.cpu
    checks: tuple[tuple[str, Callable[[], bool] | None], ...] = (
        ("amx_bf16", getattr(cpu, "_is_amx_tile_supported", None)),
        ("avx512_bf16", getattr(cpu, "_is_avx512_bf16_supported", None)),
    )
    for feature, supported in checks:
        if supported is not None and supported():
            return feature
    return None


def choose_precision(
    dtype: str,
    device: torch.device,
    kind: str,
    feature: Callable[[], str | None] = native_bf16_feature,
) -> Precision:
    """The precision `dtype` means for `kind` on `device`; `feature`: the CPU's native bf16 support
    (a parameter so tests can name a processor this machine is not)."""
    if dtype != "auto":
        if dtype not in DTYPES:
            raise ModelLoadError(f"dtype: {dtype!r} is not one of {['auto', *sorted(DTYPES)]} (--dtype)")
        return Precision(DTYPES[dtype], "set")
    if device.type == "cuda":
        return Precision(torch.bfloat16, "auto:cuda")
    native = feature()
    if native is None:
        return Precision(torch.float32, "auto:cpu-no-native-bf16")
    if BF16_RANKINGS_HOLD.get(kind, False):
        return Precision(torch.bfloat16, f"auto:cpu-{native}+{kind}-rankings-hold")
    return Precision(torch.float32, f"auto:cpu-{native}+{kind}-rankings-differ")
