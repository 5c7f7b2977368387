"""Start-up warm-up: full batches at the served shapes run before readiness, and a FlexAttention that
fails there is replaced by cascade when the backend was chosen automatically (on a GPU that choice is
flex; here the failure is injected into the backend registry)."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from kafka_scorer.engine.attention import registry
from kafka_scorer.engine.scorer import Scorer
from kafka_scorer.engine.warm_up import warm_up_jobs
from kafka_scorer.wire.protocol import Job


def _broken_flex(*args, **kwargs):
    raise RuntimeError("flex rejects this head layout")


def _break_flex(monkeypatch) -> None:
    broken = dataclasses.replace(registry.BACKENDS["flex"], attend=_broken_flex)
    monkeypatch.setitem(registry.BACKENDS, "flex", broken)


def _job() -> Job:
    return Job(id="j", query=[5, 6, 7, 8], items=[[9, 10], [11]], label_token_ids=[1, 2], multi_item=True)


@pytest.fixture
def flex_scorer(tiny_models):
    def make(auto: bool) -> Scorer:
        scorer = Scorer(str(tiny_models.get("qwen3", "causal")), dtype="float32", device="cpu")
        scorer.attention_backend = "flex"
        scorer._auto_backend = auto  # what "auto" picks on CUDA; the CPU would pick cascade at once
        return scorer

    return make


def test_an_automatic_flex_that_fails_at_warm_up_becomes_cascade(flex_scorer, monkeypatch, caplog) -> None:
    scorer = flex_scorer(auto=True)
    reference = Scorer(str(scorer.loaded.name), dtype="float32", device="cpu", attention_backend="dense")
    _break_flex(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="kafka_scorer.engine.scorer"):
        scorer.warm_up()
    assert scorer.attention_backend == "cascade"
    assert [r.getMessage() for r in caplog.records if "'flex' failed" in r.getMessage()]
    got, want = scorer.score_jobs([_job()])[0], reference.score_jobs([_job()])[0]
    assert got.error is None
    assert max(abs(a - b) for ra, rb in zip(got.scores, want.scores) for a, b in zip(ra, rb)) < 1e-5


def test_a_chosen_backend_is_kept_with_a_warning(flex_scorer, monkeypatch, caplog) -> None:
    scorer = flex_scorer(auto=False)
    _break_flex(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="kafka_scorer.engine.scorer"):
        scorer.warm_up()
    assert scorer.attention_backend == "flex"
    assert any("warm-up batch failed" in r.getMessage() for r in caplog.records)


def test_deterministic_mode_s_span_kernel_failing_at_warm_up_leaves_the_mode_on_its_tiles(
    tiny_models, monkeypatch, caplog
) -> None:
    """On CUDA the mode picks the span kernel itself ("auto"); a kernel that fails at the model's shapes
    leaves the mode on the tiles, with one line, and jobs keep their bits and the dense scores."""
    scorer = Scorer(
        str(tiny_models.get("qwen3", "causal")), dtype="float32", device="cpu", deterministic=True
    )
    scorer.attention_backend = "deterministic-spans"  # what "auto" picks on CUDA; the CPU picks segmented
    reference = Scorer(str(scorer.loaded.name), dtype="float32", device="cpu", attention_backend="dense")
    tiles = Scorer(
        str(scorer.loaded.name),
        dtype="float32",
        device="cpu",
        deterministic=True,
        attention_backend="deterministic",
    )
    from kafka_scorer.engine.attention import aligned_spans

    monkeypatch.setattr(aligned_spans, "triton_runs_on", lambda device: True)
    monkeypatch.setattr(aligned_spans, "_kernel", _broken_flex)
    with caplog.at_level(logging.WARNING, logger="kafka_scorer.engine.warm_up"):
        scorer.warm_up()
    assert scorer.attention_backend == "deterministic"
    assert [r.getMessage() for r in caplog.records if "'deterministic-spans' failed" in r.getMessage()]
    got, want = scorer.score_jobs([_job()])[0], reference.score_jobs([_job()])[0]
    assert got.error is None and got.scores == tiles.score_jobs([_job()])[0].scores
    assert max(abs(a - b) for ra, rb in zip(got.scores, want.scores) for a, b in zip(ra, rb)) < 1e-5


def test_warm_up_fills_the_budget_with_a_packed_sequence_and_pairs(tiny_models) -> None:
    scorer = Scorer(str(tiny_models.get("qwen3", "causal")), dtype="float32", device="cpu")
    prepared = [scorer.prepare(job, job.id) for job in warm_up_jobs(scorer)]
    assert [p.packed for p in prepared] == [True, False]
    assert prepared[1].num_tokens <= scorer.max_batch_tokens < prepared[1].num_tokens * 1.1
    scorer.warm_up()  # the served backend passes at these shapes: nothing changes
    assert scorer.attention_backend == "cascade"
