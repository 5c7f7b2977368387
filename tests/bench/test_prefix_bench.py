"""`bench --workload judge`: a quick run shows the prefix cache at work and changing no score."""

from __future__ import annotations

from kafka_scorer_bench.prefix import format_prefix_report, run_prefix_bench


def test_quick_prefix_bench(tmp_path) -> None:
    report = run_prefix_bench(
        device="cpu",
        dtype="float32",
        model_shape=None,
        quick=True,
        seed=0,
        model_dir=str(tmp_path),
        repeats=1,
        log=lambda _: None,
    )
    judge, plain = report["runs"]["judge"], report["runs"]["no shared prefix"]
    # the rubric is run once per worker: every timed job serves it from the cache
    assert judge["token_ratio"] > 3 and judge["cached_tokens"] > 0 and judge["cache"]["hits"] > 0
    assert report["runs"]["rerank (qwen3-reranker)"]["cached_tokens"] > 0
    assert plain["token_ratio"] == 1.0 and plain["cached_tokens"] == 0  # fresh queries: nothing to share
    for run in report["runs"].values():
        assert run["max_score_diff"] <= 1e-5
    assert report["invariance"]["float32"]["max_diff"] <= 1e-5
    assert "bfloat16" in report["invariance"]
    assert "| judge |" in format_prefix_report(report)
