"""The `long-docs` bench workload: the issue's shape, and a quick run whose engine rows agree with
`CrossEncoder.predict` on hand-split windows and whose MIS run packs the windows (structural only)."""

from __future__ import annotations

import pytest

from kafka_scorer.checkpoints.real_models import MissingCheckpoint, minilm_source
from kafka_scorer_bench.long_docs import LongDocShape, build_long_doc_jobs, run_long_docs_bench


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(minilm_source())
    except MissingCheckpoint as exc:
        pytest.fail(str(exc))


def test_full_size_documents_are_mostly_longer_than_a_pair(tokenizer) -> None:
    shape = LongDocShape()
    jobs = build_long_doc_jobs(tokenizer, shape, seed=1)
    assert jobs == build_long_doc_jobs(tokenizer, shape, seed=1)  # seeded
    lengths = [
        len(tokenizer(item, add_special_tokens=False)["input_ids"]) for job in jobs for item in job.items
    ]
    assert len(lengths) == shape.docs and all(shape.doc_min <= n <= shape.doc_max for n in lengths)
    assert sum(n > shape.pair_limit for n in lengths) > len(lengths) / 2  # most need chunking
    assert max(lengths) > 4 * min(lengths)
    assert all(job.chunking is not None and job.chunking.aggregate == "max" for job in jobs)


def test_quick_run_agrees_and_packs_the_windows() -> None:
    report = run_long_docs_bench(quick=True, repeats=1, log=lambda *a: None)
    assert report["ok"], report
    ce, dec = report["cross_encoder"], report["decoder"]
    assert set(ce["contenders"]) == {"cross-encoder", "engine"}
    assert ce["windows"] > ce["items"]  # documents really were split
    assert ce["contenders"]["engine"]["max_abs_diff"] <= 1e-4
    assert set(dec["contenders"]) == {"pairs", "mis"}
    assert dec["tokens"]["mis"] < dec["tokens"]["pairs"] and dec["token_ratio"] > 1
