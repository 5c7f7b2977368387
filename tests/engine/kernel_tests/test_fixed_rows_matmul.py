"""Deterministic mode's fixed-tile Triton matmul (engine/kernels/fixed_rows_matmul_triton.py), run by
triton's interpreter, against a float64 matmul of the same inputs and against itself.

What is proved, float32 and bfloat16, with and without a bias, for widths that leave ragged column and
inner-dimension tiles and for a one-output projection (where the CPU's batched matmul changed kernels):
- the result equals x · wᵀ + b computed in float64, to float32 rounding (bfloat16: its output cast);
- block 0's rows have the same bits computed alone, with 1, 2 or 3 more blocks behind them, and as the
  call's second block: the promise `layers/invariant.py` makes for every strategy;
- a row count that is not whole blocks is refused.
All cases run in one subprocess (`_interpreted_fixed_rows_matmul.py`). Whether the compiled kernel
keeps the promise on tensor cores is for the GPU (`kafka_scorer_bench/fixed_matmul.py` checks its bits
there); that it compiles for an H100 without spills is test_kernels_compile_for_sm90.py's.
"""

from __future__ import annotations

import pytest
import torch

from kafka_scorer.engine.layers.invariant import ROWS
from tests.engine.kernel_tests.interpreter import run_interpreted

SHAPES = {  # name -> (in, out, bias)
    "k64-n96": (64, 96, False),
    "k100-n300-bias": (100, 300, True),
    "k256-one-output": (256, 1, False),
    "k48-n130-bias": (48, 130, True),
}
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
BLOCKS = 4
TOLERANCE = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    torch.bfloat16: {"rtol": 2**-7, "atol": 1e-3},  # the interpreter's bfloat16 cast truncates
}


def cases() -> dict[str, dict]:
    out, gen = {}, torch.Generator().manual_seed(0)
    for shape_name, (inner, outputs, with_bias) in SHAPES.items():
        for dtype_name, dtype in DTYPES.items():
            x = torch.randn(BLOCKS * ROWS, inner, generator=gen)
            weight = torch.randn(outputs, inner, generator=gen) / inner**0.5
            bias = torch.randn(outputs, generator=gen) if with_bias else None
            out[f"{shape_name}/{dtype_name}"] = {
                "x": x.to(dtype),
                "weight": weight.to(dtype),
                "bias": None if bias is None else bias.to(dtype),
            }
    return out


@pytest.fixture(scope="module")
def inputs() -> dict[str, dict]:
    return cases()


@pytest.fixture(scope="module")
def interpreted(inputs: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_interpreted(
        "_interpreted_fixed_rows_matmul.py", inputs, tmp_path_factory.mktemp("rows_matmul")
    )


@pytest.mark.parametrize("name", [f"{s}/{d}" for s in SHAPES for d in DTYPES])
def test_the_kernel_equals_a_float64_matmul(name, inputs, interpreted) -> None:
    given, got = inputs[name], interpreted[name]["full"]
    want = given["x"].double() @ given["weight"].double().T
    if given["bias"] is not None:
        want += given["bias"].double()
    assert got.dtype == given["x"].dtype and got.shape == want.shape
    torch.testing.assert_close(got.double(), want, **TOLERANCE[got.dtype])


@pytest.mark.parametrize("name", [f"{s}/{d}" for s in SHAPES for d in DTYPES])
def test_block_zero_keeps_its_bits_at_every_block_count_and_place(name, interpreted) -> None:
    got = interpreted[name]
    block = got["full"][:ROWS]
    assert len(got["prefixes"]) == BLOCKS - 1
    assert all(torch.equal(prefix, block) for prefix in got["prefixes"])
    assert torch.equal(got["moved"], block)


def test_rows_that_are_not_whole_blocks_are_refused(interpreted) -> None:
    assert "not a multiple of" in interpreted["ragged"]
