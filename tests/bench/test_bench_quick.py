"""`kafka-scorer bench --quick`: every contender, every metric, every ratio, and a cross-check that bites.

Nothing here times anything: speed belongs to the benchmark's own output, not to pass/fail. What is
checked is that the harness measures what it says it measures: (a) really runs every item as its own
pair and (b) really packs (their token counts must give the workload's exact token ratio), every
contender's scores agree with the baseline, and the baseline itself agrees with a plain transformers
forward of one pair at a time.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kafka_scorer.cli import main
from kafka_scorer_bench.workloads import WORKLOADS

METRICS = (
    "items_per_s",
    "tokens_per_s",
    "pair_tokens_per_s",
    "latency_p50_s",
    "latency_p99_s",
    "peak_memory_bytes",
    "floor_fraction",
    "wall_s",
)


def _run_bench(tmp_path: Path, *flags: str) -> tuple[int, dict]:
    out = tmp_path / "bench.json"
    rc = main(["bench", "--quick", "--json", str(out), *flags])
    return rc, json.loads(out.read_text())


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict]:
    return _run_bench(tmp_path_factory.mktemp("bench"), "--skip-worker")


def test_quick_bench_exits_zero_with_every_workload(quick_report) -> None:
    rc, report = quick_report
    assert rc == 0
    assert report["ok"] is True
    assert set(report["workloads"]) == set(WORKLOADS)
    assert report["matmul_peak"]["flops_per_s"] > 0
    assert report["label_kernel"] is not None and "paths" in report["label_kernel"]
    targets = {t["target"]: t for t in report["targets"]}
    assert any(name.startswith("rerank: (b)/(c)") for name in targets)
    assert any(name.startswith("many-items: (b)/(a)") for name in targets)
    for t in targets.values():
        assert t["met"] == (t["value"] >= t["goal"])


@pytest.mark.parametrize("workload", WORKLOADS)
def test_every_contender_reports_every_metric(quick_report, workload: str) -> None:
    _, report = quick_report
    w = report["workloads"][workload]
    backends = report["meta"]["backends"]
    assert {"dense", "cascade"} <= set(backends)
    # b:layers: the same MIS run on transformers' own layers (the fused forward's before/after)
    assert set(w["contenders"]) == {"a", "c", "b:layers", *(f"b:{b}" for b in backends)}
    assert w["ratios"]["fused_over_layers"] > 0
    for key, c in w["contenders"].items():
        assert c["errors"] == 0, (key, c["first_error"])
        assert c["jobs"] == w["jobs"] and c["items"] == w["items"]
        for metric in METRICS:
            assert isinstance(c[metric], (int, float)) and math.isfinite(c[metric]), (key, metric)
        assert c["items_per_s"] > 0 and c["tokens_per_s"] > 0 and c["wall_s"] > 0
        assert 0 < c["latency_p50_s"] <= c["latency_p99_s"]
        assert c["peak_memory_bytes"] >= 0
        assert 1 <= c["runs"] <= 3


@pytest.mark.parametrize("workload", WORKLOADS)
def test_ratios_are_reported(quick_report, workload: str) -> None:
    _, report = quick_report
    w = report["workloads"][workload]
    ratios = w["ratios"]
    c = w["contenders"]
    for backend in report["meta"]["backends"]:
        b = c[f"b:{backend}"]
        assert ratios["b_over_a"][backend] == pytest.approx(b["items_per_s"] / c["a"]["items_per_s"])
        assert ratios["b_over_c"][backend] == pytest.approx(b["items_per_s"] / c["c"]["items_per_s"])
        assert ratios["b_over_a_vs_token_ratio"][backend] == pytest.approx(
            ratios["b_over_a"][backend] / ratios["token_ratio_a_over_b"]
        )


@pytest.mark.parametrize("workload", ["rerank", "many-items", "short"])
def test_token_counts_prove_no_mis_and_mis_ran(quick_report, workload: str) -> None:
    """(a) computes n·(Q+I) tokens per job, (b) Q+n·I: if either path silently took the other's
    route the ratio would come out 1 (or inverted)."""
    _, report = quick_report
    w = report["workloads"][workload]
    s = w["spec"]["shape"]
    q, n, i, jobs = s["query_len"], s["num_items"], s["item_len"], w["jobs"]
    assert w["contenders"]["a"]["forward_tokens"] == jobs * n * (q + i)
    for backend in report["meta"]["backends"]:
        assert w["contenders"][f"b:{backend}"]["forward_tokens"] == jobs * (q + n * i)
    assert w["ratios"]["token_ratio_a_over_b"] == pytest.approx(n * (q + i) / (q + n * i))


@pytest.mark.parametrize("workload", WORKLOADS)
def test_cross_check_against_the_baseline_is_small(quick_report, workload: str) -> None:
    _, report = quick_report
    w = report["workloads"][workload]
    assert w["cross_check"]["ok"] is True
    assert w["cross_check"]["max_abs_diff"] <= 1e-4  # float32 on CPU: summation order only
    for key, c in w["contenders"].items():
        if key != "c":
            assert c["max_abs_diff_vs_baseline"] is not None and c["max_abs_diff_vs_baseline"] <= 1e-4


def test_cross_check_fails_the_run_when_scores_are_wrong(tmp_path: Path, monkeypatch) -> None:
    """A harness whose check never fires proves nothing: skew the baseline and the run must fail."""
    from kafka_scorer_bench import baseline

    real = baseline.BaselineScorer.score_rows

    def skewed(self, jobs, rows):
        scores, padded = real(self, jobs, rows)
        return [[v + 0.01 for v in row] for row in scores], padded

    monkeypatch.setattr(baseline.BaselineScorer, "score_rows", skewed)
    rc, report = _run_bench(tmp_path, "--skip-worker", "--skip-label-kernel", "--workload", "rerank")
    assert rc == 1
    assert report["ok"] is False
    check = report["workloads"]["rerank"]["cross_check"]
    assert check["ok"] is False and check["max_abs_diff"] == pytest.approx(0.01, abs=1e-4)


def test_compiled_layers_are_timed_beside_the_same_layers_eager(tmp_path: Path) -> None:
    """`--decoder-forward compiled` (CUDA's default): (b:eager) runs the same fused layers uncompiled on
    the same Scorer, so the report says what compiling buys, and both score as the baseline does."""
    rc, report = _run_bench(
        tmp_path,
        "--skip-worker",
        "--skip-label-kernel",
        "--workload",
        "rerank",
        "--backend",
        "cascade",
        "--decoder-forward",
        "compiled",
    )
    assert rc == 0 and report["ok"] is True
    w = report["workloads"]["rerank"]
    assert {"b:eager", "b:layers", "b:cascade"} <= set(w["contenders"])
    assert w["contenders"]["b:eager"]["errors"] == 0
    assert w["contenders"]["b:eager"]["max_abs_diff_vs_baseline"] < 1e-4
    assert w["ratios"]["compiled_over_eager"] > 0


def test_pairs_run_through_the_pair_kernels_when_they_are_measured(tmp_path: Path) -> None:
    """With varlen among the backends, (a) runs once more through it (`a:varlen`): every job's items as
    their own pairs, scored as the baseline scores them, with its ratio to the baseline beside the
    default backend's; spans, built for MIS items, and the default backend get no second (a)."""
    rc, report = _run_bench(
        tmp_path,
        "--skip-worker",
        "--skip-label-kernel",
        "--workload",
        "many-items",
        "--backend",
        "cascade",
        "--backend",
        "varlen",
        "--backend",
        "spans",
    )
    assert rc == 0 and report["ok"] is True
    w = report["workloads"]["many-items"]
    c, ratios = w["contenders"], w["ratios"]
    assert "a:varlen" in c and "a:spans" not in c and "a:cascade" not in c
    pairs = c["a:varlen"]
    assert pairs["errors"] == 0 and pairs["max_abs_diff_vs_baseline"] <= 1e-4
    assert pairs["forward_tokens"] == c["a"]["forward_tokens"]  # the same pairs, not packed items
    assert ratios["a_by_backend_over_c"] == {
        "varlen": pytest.approx(pairs["items_per_s"] / c["c"]["items_per_s"])
    }


def test_the_report_so_far_is_handed_on_after_each_workload(tmp_path: Path) -> None:
    """What a gpu-check step killed at its limit keeps: after rerank, a whole report of rerank alone,
    marked partial, whose tables the check prints as such; at the end, the whole report."""
    from devtools.gpu_check.run import Outcome
    from devtools.gpu_check.tables import step_markdown
    from kafka_scorer_bench.harness import BenchConfig, run_bench

    config = BenchConfig(
        workloads=("rerank", "short"),
        quick=True,
        skip_worker=True,
        skip_label_kernel=True,
        backends=("cascade",),
        model_dir=str(tmp_path),
        verbose=False,
    )
    so_far: list[dict] = []
    final = run_bench(config, lambda report: so_far.append(json.loads(json.dumps(report))))
    assert [list(r["workloads"]) for r in so_far] == [["rerank"], ["rerank", "short"]]
    assert all(r["partial"] for r in so_far) and final["partial"] is False and final["ok"] is True
    assert so_far[0]["workloads"]["rerank"] == json.loads(json.dumps(final["workloads"]["rerank"]))
    text = step_markdown(Outcome("bench-0.6b", "timeout", 9.0, note="killed after 9 s", report=so_far[0]))
    assert "**partial** (timeout: killed after 9 s): the workloads finished before it: rerank" in text
    assert "engine, MIS on [cascade]" in text and "short" not in text.split("rerank", 1)[1]
