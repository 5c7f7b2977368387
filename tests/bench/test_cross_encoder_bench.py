"""The `cross-encoder` bench workload: the issue's shapes, and a quick run whose contenders all agree
with `CrossEncoder.predict` (real MiniLM weights; a missing checkpoint package fails, not skips)."""

from __future__ import annotations

import pytest

from kafka_scorer.checkpoints.real_models import MissingCheckpoint, minilm_source
from kafka_scorer_bench.cross_encoder import (
    CrossEncoderShape,
    build_cross_encoder_jobs,
    run_cross_encoder_bench,
)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(minilm_source())
    except MissingCheckpoint as exc:
        pytest.fail(str(exc))


def test_full_size_jobs_have_the_issues_shape(tokenizer) -> None:
    shape = CrossEncoderShape()
    jobs = build_cross_encoder_jobs(tokenizer, 2, seed=3)
    assert jobs == build_cross_encoder_jobs(tokenizer, 2, seed=3)  # seeded
    by_query: dict[str, list[int]] = {}
    for job in jobs:
        assert len(tokenizer(job.query, add_special_tokens=False)["input_ids"]) == shape.query_tokens
        by_query.setdefault(job.query, []).append(len(job.items))
        lengths = [len(tokenizer(item, add_special_tokens=False)["input_ids"]) for item in job.items]
        assert all(shape.doc_min <= n <= shape.doc_max for n in lengths)
    assert len(by_query) == 2
    for sizes in by_query.values():
        assert sum(sizes) == shape.docs_per_query
        assert all(shape.job_min <= n <= shape.job_max for n in sizes[:-1])  # the last takes what is left
    lengths = [len(tokenizer(i, add_special_tokens=False)["input_ids"]) for j in jobs for i in j.items]
    assert max(lengths) > 3 * min(lengths)  # spread like web passages, not one length


def test_quick_run_every_contender_agrees_with_cross_encoder(tokenizer) -> None:
    report = run_cross_encoder_bench(
        num_queries=1, quick=True, skip_worker=True, repeats=1, log=lambda *a: None
    )
    assert report["ok"], report
    assert set(report["contenders"]) == {"cross-encoder", "padded", "engine"}
    assert report["items"] == 12
    assert report["padded_tokens"] >= report["cross_encoder_tokens"] >= report["pair_tokens"]
    for contender in report["contenders"].values():
        assert contender["errors"] == 0 and contender["max_abs_diff_vs_cross_encoder"] <= 1e-4
        assert contender["items_per_s"] > 0 and contender["floor_fraction"] > 0
    assert report["ratios"]["engine_over_cross_encoder"] > 0
