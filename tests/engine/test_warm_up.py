"""Start-up warm-up: full batches at the served shapes run before readiness. A FlexAttention that fails
there is replaced by cascade when the backend was chosen automatically (on a GPU that choice is flex;
here the failure is injected into the backend registry), and compiled decoder layers that fail run
eagerly; each fallback alone first, so one failure never costs the other's speed."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from kafka_scorer.engine.attention import registry
from kafka_scorer.engine.kinds import served
from kafka_scorer.engine.load import deterministic
from kafka_scorer.engine.load.deterministic import SPANS_BACKEND
from kafka_scorer.engine.load.start_up import StartUp
from kafka_scorer.engine.load.warm_up import warm_up, warm_up_jobs
from kafka_scorer.engine.models.decoder import FusedDecoder
from kafka_scorer.engine.models.decoder_layer import Regions
from kafka_scorer.engine.run.variants import Variant
from kafka_scorer.engine.scorer import Scorer
from kafka_scorer.wire.protocol import Job
from tests.engine.reference import reference_scores


def _broken_flex(*args, **kwargs):
    raise RuntimeError("flex rejects this head layout")


def _break_flex(monkeypatch) -> None:
    broken = dataclasses.replace(registry.BACKENDS["flex"], attend=_broken_flex)
    monkeypatch.setitem(registry.BACKENDS, "flex", broken)


def _job() -> Job:
    return Job(id="j", query=[5, 6, 7, 8], items=[[9, 10], [11]], label_token_ids=[1, 2], multi_item=True)


def _auto_picks_flex(monkeypatch) -> None:
    """ "auto" picks flex, as on CUDA (the CPU would pick cascade at once)."""
    monkeypatch.setattr(served, "choose_attention_backend", lambda device: "flex")


@pytest.fixture
def flex_scorer(tiny_models, monkeypatch):
    def make(auto: bool) -> Scorer:
        path = str(tiny_models.get("qwen3", "causal"))
        _auto_picks_flex(monkeypatch)
        backend = "auto" if auto else "flex"
        return Scorer(path, dtype="float32", device="cpu", max_batch_tokens=512, attention_backend=backend)

    return make


def test_an_automatic_flex_that_fails_at_warm_up_becomes_cascade(flex_scorer, monkeypatch, caplog) -> None:
    scorer = flex_scorer(auto=True)
    reference = Scorer(
        str(scorer.describe().loaded.name), dtype="float32", device="cpu", attention_backend="dense"
    )
    _break_flex(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="kafka_scorer.engine"):
        scorer.engine.warm_up()
    assert scorer.describe().attention_backend == "cascade"
    assert [r.getMessage() for r in caplog.records if "'flex' failed" in r.getMessage()]
    got, want = scorer.score_jobs([_job()])[0], reference.score_jobs([_job()])[0]
    assert got.error is None
    assert max(abs(a - b) for ra, rb in zip(got.scores, want.scores) for a, b in zip(ra, rb)) < 1e-5


def test_the_start_up_stage_returns_its_choice_and_leaves_the_engine_as_it_was(flex_scorer, monkeypatch):
    """The stage is handed narrow capabilities (here built from the engine's public calls) and returns
    the backend it settled on; the engine keeps it only when its own `warm_up` does."""
    scorer = flex_scorer(auto=True)
    engine, view = scorer.engine, scorer.describe()
    tried: list[str] = []

    def score_jobs(jobs, backend: str):
        tried.append(backend)
        with engine.running(Variant(backend, None)):
            return scorer.score_jobs(jobs)

    limits, budget = view.kind.preparer.limits, engine.max_batch_tokens
    parts = StartUp(
        view.loaded, view.runner, None, limits, budget, True, score_jobs, engine.prepare, lambda: None
    )
    _break_flex(monkeypatch)
    assert warm_up(parts, "flex") == "cascade"
    assert tried[0] == "flex" and tried[-1] == "cascade"
    assert scorer.describe().attention_backend == "flex"  # nothing below the engine wrote it


def test_a_chosen_backend_is_kept_with_a_warning(flex_scorer, monkeypatch, caplog) -> None:
    scorer = flex_scorer(auto=False)
    _break_flex(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="kafka_scorer.engine"):
        scorer.engine.warm_up()
    assert scorer.describe().attention_backend == "flex"
    assert any("warm-up batch failed" in r.getMessage() for r in caplog.records)


def test_deterministic_mode_s_span_kernel_failing_at_warm_up_leaves_the_mode_on_its_tiles(
    tiny_models, monkeypatch, caplog
) -> None:
    """On CUDA the mode picks the span kernel itself ("auto"); a kernel that fails at the model's shapes
    leaves the mode on the tiles, with one line, and jobs keep their bits and the dense scores."""
    # what "auto" picks on CUDA; the CPU picks segmented
    monkeypatch.setattr(deterministic, "mode_backend", lambda device, encoder=False: SPANS_BACKEND)
    scorer = Scorer(  # as on CUDA, where the mode's span and tile backends keep no prefix cache
        str(tiny_models.get("qwen3", "causal")),
        dtype="float32",
        device="cpu",
        deterministic=True,
        prefix_cache_mb=0,
    )
    assert scorer.describe().attention_backend == SPANS_BACKEND
    reference = Scorer(
        str(scorer.describe().loaded.name), dtype="float32", device="cpu", attention_backend="dense"
    )
    tiles = Scorer(
        str(scorer.describe().loaded.name),
        dtype="float32",
        device="cpu",
        deterministic=True,
        attention_backend="deterministic",
    )
    from kafka_scorer.engine.attention import aligned_spans

    monkeypatch.setattr(aligned_spans, "triton_runs_on", lambda device: True)
    monkeypatch.setattr(aligned_spans, "_kernel", _broken_flex)
    with caplog.at_level(logging.WARNING, logger="kafka_scorer.engine.load.warm_up"):
        scorer.engine.warm_up()
    assert scorer.describe().attention_backend == "deterministic"
    assert [r.getMessage() for r in caplog.records if "'deterministic-spans' failed" in r.getMessage()]
    got, want = scorer.score_jobs([_job()])[0], reference.score_jobs([_job()])[0]
    assert got.error is None and got.scores == tiles.score_jobs([_job()])[0].scores
    assert max(abs(a - b) for ra, rb in zip(got.scores, want.scores) for a, b in zip(ra, rb)) < 1e-5


def test_warm_up_fills_the_budget_with_a_packed_sequence_and_pairs(tiny_models) -> None:
    scorer = Scorer(str(tiny_models.get("qwen3", "causal")), dtype="float32", device="cpu")
    prepared = [scorer.engine.prepare(job, job.id) for job in warm_up_jobs(_start_up(scorer))]
    assert [p.packed for p in prepared] == [True, False]
    assert prepared[1].num_tokens <= scorer.engine.max_batch_tokens < prepared[1].num_tokens * 1.1
    scorer.engine.warm_up()  # the served backend passes at these shapes: nothing changes
    assert scorer.describe().attention_backend == "cascade"


def _start_up(scorer: Scorer) -> StartUp:
    """The start-up stage's capabilities, as the engine hands them over (only the parts the warm-up's
    job sizes read are real)."""
    view = scorer.describe()
    limits = view.kind.preparer.limits
    budget = scorer.engine.max_batch_tokens
    return StartUp(view.loaded, view.runner, None, limits, budget, False, _unused, _unused, _unused)


def _unused(*args):
    raise AssertionError("the warm-up's job sizes call nothing")


def _broken_region(*args, **kwargs):
    raise RuntimeError("InductorError: InvalidCxxCompiler: No working C++ compiler found")


WORKING = "working"
"""`_compiled_scorer`'s stand-in for compiled regions that compile fine: the eager ones, marked compiled."""


def _compiled_scorer(tiny_models, monkeypatch, regions: Regions | str) -> Scorer:
    """A scorer on automatic flex (CUDA's choice) whose fused layers count as compiled: `regions` stand
    in for `torch.compile`'s wrappers, so no test here pays for a real compile. A small budget keeps
    the warm-up's batches (run again for each fallback tried) quick under flex's eager reference."""
    path = str(tiny_models.get("qwen3", "causal"))
    _auto_picks_flex(monkeypatch)
    scorer = Scorer(path, dtype="float32", device="cpu", max_batch_tokens=512)
    body = scorer.describe().loaded.body
    assert isinstance(body, FusedDecoder)
    eager = dataclasses.replace(Regions.eager(body.shape), compiled=True)
    body.regions = eager if regions == WORKING else regions
    return scorer


def _assert_reference_scores(scorer: Scorer) -> None:
    job = _job()
    got = scorer.score_jobs([job])[0]
    want = reference_scores(scorer.describe().loaded.name, job.query, job.items, job.label_token_ids)
    assert got.error is None
    assert max(abs(a - b) for ra, rb in zip(got.scores, want) for a, b in zip(ra, rb)) < 1e-5


def _lines(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def test_compiled_layers_that_fail_at_warm_up_run_eagerly_and_flex_stays(
    tiny_models, monkeypatch, caplog
) -> None:
    broken = Regions(_broken_region, _broken_region, compiled=True)
    scorer = _compiled_scorer(tiny_models, monkeypatch, broken)
    with caplog.at_level(logging.WARNING, logger="kafka_scorer.engine"):
        scorer.engine.warm_up()
    assert scorer.describe().loaded.body.regions == Regions.eager(scorer.describe().loaded.body.shape)
    assert scorer.describe().attention_backend == "flex"  # the compiler broke, not flex: flex keeps serving
    assert scorer.describe().fields["decoder_forward"] == "fused-eager"  # the start-up line says so
    (line,) = _lines(caplog, "compiled layers failed")
    assert "InvalidCxxCompiler" in line and "KAFKA_SCORER_DECODER_FORWARD=fused" in line and "\n" not in line
    assert not _lines(caplog, "serving anyway")
    _assert_reference_scores(scorer)


def test_a_flex_that_fails_at_warm_up_keeps_the_compiled_layers(tiny_models, monkeypatch, caplog) -> None:
    scorer = _compiled_scorer(tiny_models, monkeypatch, WORKING)
    working = scorer.describe().loaded.body.regions
    _break_flex(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="kafka_scorer.engine"):
        scorer.engine.warm_up()
    assert (
        scorer.describe().loaded.body.regions is working and scorer.describe().attention_backend == "cascade"
    )
    assert _lines(caplog, "'flex' failed") and not _lines(caplog, "compiled layers failed")
    _assert_reference_scores(scorer)


def test_when_both_fail_both_fall_back(tiny_models, monkeypatch, caplog) -> None:
    scorer = _compiled_scorer(
        tiny_models, monkeypatch, Regions(_broken_region, _broken_region, compiled=True)
    )
    _break_flex(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="kafka_scorer.engine"):
        scorer.engine.warm_up()
    assert (
        not scorer.describe().loaded.body.regions.compiled
        and scorer.describe().attention_backend == "cascade"
    )
    assert _lines(caplog, "'flex' failed") and _lines(caplog, "compiled layers failed")
    assert not _lines(caplog, "serving anyway")
    _assert_reference_scores(scorer)


def test_without_a_c_compiler_the_compiled_layers_run_eagerly(tiny_models, tmp_path) -> None:
    """The real failure, not an injected one: inductor pointed at a C++ compiler that does not exist,
    a fresh compile cache (a cached kernel would hide it), `decoder_forward="compiled"` as an operator
    on the CPU would set it. Without the fallback every job of the process is an internal error."""
    path = tiny_models.get("qwen3", "causal")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    script = Path(__file__).with_name("_warm_up_without_compiler.py")
    run = subprocess.run(
        [sys.executable, str(script), str(path)], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["compiled_after"] is False
    assert [line for line in report["warnings"] if "compiled layers failed" in line]
    assert any("InvalidCxxCompiler" in line for line in report["warnings"])
    job = _job()
    want = reference_scores(path, job.query, job.items, job.label_token_ids)
    assert report["error"] is None
    assert max(abs(a - b) for ra, rb in zip(report["scores"], want) for a, b in zip(ra, rb)) < 1e-5


def _break_label_kernels(monkeypatch, scorer: Scorer) -> None:
    """The Triton label kernels (CUDA's choice) stand-ins that fail as they do where Triton finds no C
    compiler; a module of their own, so triton is never imported into the test process."""

    def broken(*args, **kwargs):
        raise RuntimeError("Failed to find C compiler. Please specify via CC environment variable.")

    fake = types.ModuleType("label_scores_triton")
    fake.label_dots = fake.label_logsumexp = broken
    monkeypatch.setitem(sys.modules, "kafka_scorer.engine.kernels.label_scores_triton", fake)
    scorer.describe().runner.label_backend = "triton"


def test_triton_label_kernels_that_fail_give_way_to_torch_and_nothing_else_changes(
    tiny_models, monkeypatch, caplog
) -> None:
    scorer = _compiled_scorer(tiny_models, monkeypatch, WORKING)
    working = scorer.describe().loaded.body.regions
    _break_label_kernels(monkeypatch, scorer)
    with caplog.at_level(logging.WARNING, logger="kafka_scorer.engine"):
        scorer.engine.warm_up()
    assert scorer.describe().runner.label_backend == "torch"
    assert scorer.describe().loaded.body.regions is working and scorer.describe().attention_backend == "flex"
    assert scorer.describe().fields["label_kernels"] == "torch"
    assert scorer.describe().fields["decoder_forward"] == "fused-compiled"
    (line,) = _lines(caplog, "failed at the model's shapes")
    assert "Triton label kernels" in line and "C compiler" in line
    _assert_reference_scores(scorer)


def test_two_broken_of_three_fall_back_and_the_third_keeps_its_speed(
    tiny_models, monkeypatch, caplog
) -> None:
    """A host without a C compiler breaks the compiled layers and the label kernels; flex (here) still
    works: the pair is found before all three are given up."""
    scorer = _compiled_scorer(
        tiny_models, monkeypatch, Regions(_broken_region, _broken_region, compiled=True)
    )
    _break_label_kernels(monkeypatch, scorer)
    with caplog.at_level(logging.WARNING, logger="kafka_scorer.engine"):
        scorer.engine.warm_up()
    assert (
        not scorer.describe().loaded.body.regions.compiled
        and scorer.describe().runner.label_backend == "torch"
    )
    assert scorer.describe().attention_backend == "flex"
    layers, labels = _lines(caplog, "compiled layers failed"), _lines(caplog, "label kernels failed")
    assert len(layers) == len(labels) == 1 and not _lines(caplog, "serving anyway")
    assert "InvalidCxxCompiler" in layers[0] and "Failed to find C compiler" in labels[0]  # each its own
    _assert_reference_scores(scorer)
