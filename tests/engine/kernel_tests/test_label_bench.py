"""The label micro-benchmark: its report is complete and its memory figures show what they claim.

Timings are not asserted (performance lives in the benchmark, not in tests); peak memory on CPU is
deterministic, so the benchmark's own memory claim is checked here against the size of the logits.
"""

from __future__ import annotations

from kafka_scorer_bench.label_kernel import format_report, run_label_kernel_bench


def test_bench_reports_all_paths_and_streams_the_vocabulary() -> None:
    report = run_label_kernel_bench(
        "cpu", rows=64, vocab=65_536, hidden=64, labels=3, repeats=1, verbose=False
    )
    paths = report["paths"]
    assert set(paths) == {"baseline", "logprobs", "label_softmax"}
    logits_bytes = report["baseline_logits_bytes"]
    assert logits_bytes == 64 * 65_536 * 4
    # The baseline holds full logits (and log_softmax's output); the fused paths never hold one.
    assert paths["baseline"]["peak_bytes"] >= logits_bytes
    assert paths["logprobs"]["peak_bytes"] < logits_bytes / 4  # one 8192-column chunk: 1/8
    assert paths["label_softmax"]["peak_bytes"] < logits_bytes / 50
    # Same answers as the baseline, so the race compares like with like.
    assert paths["logprobs"]["max_abs_diff"] < 1e-4
    assert paths["label_softmax"]["max_abs_diff"] < 1e-5
    assert set(report["speedup_vs_baseline"]) == {"logprobs", "label_softmax"}
    assert "label_softmax" in format_report(report)
