"""`dtype=auto` chooses by measurement (engine/load/precision.py): the per-kind table it reads is held
here to a fresh run of the fidelity test (tests/engine/fidelity.py, bf16 engine against an independent
float32 reference), and the choice itself to the processor and the setting."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kafka_scorer.engine.load.precision import BF16_RANKINGS_HOLD, choose_precision, native_bf16_feature
from kafka_scorer.engine.models.loaded import ModelLoadError
from tests.engine import fidelity

CPU = torch.device("cpu")
TEST_QUERIES = 6
"""Queries per kind here (docs/performance.md's table: 50); a kind near the bar would flip, and says so."""


def avx512_bf16() -> str:
    return "avx512_bf16"


def no_native_bf16() -> None:
    return None


@pytest.mark.parametrize("kind", sorted(BF16_RANKINGS_HOLD))
def test_auto_on_a_cpu_without_native_bf16_stays_float32(kind: str) -> None:
    chosen = choose_precision("auto", CPU, kind, feature=no_native_bf16)
    assert (chosen.dtype, chosen.reason) == (torch.float32, "auto:cpu-no-native-bf16")


@pytest.mark.parametrize("kind", sorted(BF16_RANKINGS_HOLD))
def test_auto_on_a_native_bf16_cpu_follows_the_measured_table(kind: str) -> None:
    chosen = choose_precision("auto", CPU, kind, feature=avx512_bf16)
    held = BF16_RANKINGS_HOLD[kind]
    assert chosen.dtype is (torch.bfloat16 if held else torch.float32)
    assert chosen.reason == f"auto:cpu-avx512_bf16+{kind}-rankings-{'hold' if held else 'differ'}"
    assert " " not in chosen.reason, "the start-up line is key=value pairs"


def test_a_kind_never_measured_stays_float32() -> None:
    assert choose_precision("auto", CPU, "some-new-kind", feature=avx512_bf16).dtype is torch.float32


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_a_named_dtype_is_forced_whatever_the_processor(dtype: str) -> None:
    for feature in (avx512_bf16, no_native_bf16):
        chosen = choose_precision(dtype, CPU, "cross_encoder", feature=feature)
        assert (chosen.name, chosen.reason) == (dtype, "set")


def test_auto_on_cuda_is_bfloat16() -> None:
    assert choose_precision("auto", torch.device("cuda"), "classifier").dtype is torch.bfloat16


def test_an_unknown_dtype_is_one_line_naming_the_setting() -> None:
    with pytest.raises(ModelLoadError, match=r"^dtype: 'fp8' is not one of .*bfloat16.*\(--dtype\)$"):
        choose_precision("fp8", CPU, "classifier")


def test_every_kind_auto_may_run_in_bf16_was_measured() -> None:
    unmeasured = {kind for kind, held in BF16_RANKINGS_HOLD.items() if held} - set(
        fidelity.checkpoints(Path("unused"))
    )
    assert not unmeasured, f"auto runs {unmeasured} in bf16 without a fidelity measurement"


def test_the_start_up_line_names_the_precision_and_why(scorer_for) -> None:
    scorer = scorer_for("qwen3", "causal", dtype="auto")
    expected = choose_precision("auto", CPU, "label_scorer")
    assert (scorer.describe().fields["dtype"], scorer.describe().fields["dtype_reason"]) == (
        expected.name,
        expected.reason,
    )
    assert (
        scorer.describe()
        .fields["dtype_reason"]
        .startswith("auto:cpu-no-native-bf16" if native_bf16_feature() is None else "auto:cpu-")
    )
    assert scorer_for("qwen3", "causal", dtype="float32").describe().fields["dtype_reason"] == "set"


@pytest.mark.parametrize("kind", sorted(fidelity.checkpoints(Path("unused"))))
def test_the_table_holds_to_a_fresh_measurement(kind: str, tmp_path: Path) -> None:
    if kind == "hybrid":
        from tests.engine.test_hybrid_models import _needs_family

        _needs_family("qwen3_5")  # Qwen3.5 came after the transformers floor (`./dev floors`)
    measured = fidelity.checkpoints(tmp_path)[kind](TEST_QUERIES)
    assert measured.holds() is BF16_RANKINGS_HOLD[kind], (
        f"{kind}: the bf16 fidelity measured now ({fidelity.HEADER.splitlines()[0]}\n{measured.row()}) "
        f"disagrees with precision.BF16_RANKINGS_HOLD[{kind!r}]; rerun `python -m tests.engine.fidelity` "
        "and update the table and docs/performance.md"
    )
