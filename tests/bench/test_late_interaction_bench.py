"""The `late-interaction` bench workload: its shapes, and a quick run whose scores agree with
sentence-transformers' MultiVectorEncoder and whose cache halves are reported."""

from __future__ import annotations

from kafka_scorer_bench.late_interaction import (
    LateShape,
    build_late_jobs,
    format_late_interaction_report,
    run_late_interaction_bench,
)


class _Words:
    def get_vocab(self) -> dict[str, int]:
        return {word: i for i, word in enumerate(["river", "delta", "kafka", "topic", "alps", "sea"])}


def test_jobs_have_the_issues_shape() -> None:
    shape = LateShape()
    distinct, repeated = build_late_jobs(_Words(), seed=1, shape=shape)
    assert len(distinct) == shape.queries and all(len(j.items) == 100 for j in distinct)
    assert len(repeated) == shape.cache_queries and len({tuple(j.items) for j in repeated}) == 1
    assert len({j.query for j in repeated}) > 1
    lengths = [len(doc.split()) for job in distinct for doc in job.items]
    assert min(lengths) >= shape.doc_min and max(lengths) <= shape.doc_max


def test_quick_run_agrees_with_the_reference() -> None:
    report = run_late_interaction_bench(quick=True, repeats=1, log=lambda *a: None)
    assert report["ok"], report["max_abs_diff_vs_reference"]
    assert len(report["cache"]["on"]) == len(report["cache"]["off"]) == LateShape().cache_queries
    assert "engine over reference" in format_late_interaction_report(report)
