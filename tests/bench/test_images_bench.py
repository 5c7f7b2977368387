"""The `images` bench workload: seeded jobs, and a quick run whose engine rows (pairs, MIS, MIS with the
feature cache) agree with transformers pair by pair, MIS running fewer tokens."""

from __future__ import annotations

from kafka_scorer_bench.images import QUICK_SHAPE, build_image_jobs, run_images_bench


def test_jobs_are_seeded_photo_searches() -> None:
    jobs = build_image_jobs(QUICK_SHAPE, seed=3)
    assert jobs == build_image_jobs(QUICK_SHAPE, seed=3)
    documents = [document for job in jobs for document in job.inputs]
    assert len(documents) == QUICK_SHAPE.jobs * QUICK_SHAPE.docs_per_job
    assert sum(isinstance(d, dict) for d in documents) == QUICK_SHAPE.jobs * (
        QUICK_SHAPE.docs_per_job - QUICK_SHAPE.text_docs
    )


def test_quick_run_agrees_with_transformers_and_packs() -> None:
    report = run_images_bench(quick=True, repeats=1, log=lambda *a: None)
    assert report["ok"], report
    contenders = report["contenders"]
    assert set(contenders) == {"transformers", "pairs", "mis", "feature_cache"}
    assert contenders["mis"]["prompt_tokens"] < contenders["pairs"]["prompt_tokens"]
    for name in ("pairs", "mis", "feature_cache"):
        assert contenders[name]["max_abs_diff"] <= 1e-4
