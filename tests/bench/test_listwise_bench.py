"""`kafka-scorer bench --workload listwise --quick`: the listwise kind, the transformers reference one job
at a time and pointwise MIS on the same documents, through the command line.

Nothing here judges speed: what is checked is that every contender scored every document of the same
jobs, that the engine's listwise scores equal the independent reference's, that the reference and the
engine read the same prompts (the same tokens per job), and that the cross-check bites.
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from kafka_scorer.cli import main
from kafka_scorer_bench.listwise import (
    QUICK_SHAPE,
    ListwiseShape,
    as_pointwise,
    build_listwise_jobs,
    listwise_report,
)
from kafka_scorer_bench.models import SHAPES
from kafka_scorer_bench.records import RunRecord
from kafka_scorer_bench.templated import WORDS

CONTENDERS = ("engine listwise", "transformers reference", "engine pointwise MIS")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict, str]:
    out = tmp_path_factory.mktemp("listwise") / "listwise.json"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rc = main(["bench", "--workload", "listwise", "--quick", "--repeats", "1", "--json", str(out)])
    return rc, json.loads(out.read_text())["listwise"], printed.getvalue()


def test_jobs_are_seeded_words_of_the_shape() -> None:
    shape = ListwiseShape()
    jobs = build_listwise_jobs(shape, seed=2)
    assert jobs == build_listwise_jobs(shape, seed=2) and jobs != build_listwise_jobs(shape, seed=3)
    assert len(jobs) == shape.jobs and all(len(job.items) == shape.docs_per_job for job in jobs)
    lengths = [len(doc.split()) for job in jobs for doc in job.items]
    assert shape.doc_min <= min(lengths) and max(lengths) <= shape.doc_max and max(lengths) > 2 * min(lengths)
    assert {word for job in jobs for doc in job.items for word in doc.split()} <= set(WORDS)


def test_pointwise_jobs_are_the_same_documents_with_mis_on() -> None:
    jobs = build_listwise_jobs(QUICK_SHAPE)
    pointwise = as_pointwise(jobs)
    assert [(j.query, j.items) for j in pointwise] == [(j.query, j.items) for j in jobs]
    assert all(j.multi_item is True for j in pointwise)


def test_quick_run_scores_every_document_and_equals_the_reference(quick_run) -> None:
    rc, report, printed = quick_run
    assert rc == 0 and report["ok"], report
    assert tuple(report["contenders"]) == CONTENDERS
    assert report["items"] == QUICK_SHAPE.jobs * QUICK_SHAPE.docs_per_job
    assert report["max_abs_diff_vs_reference"] <= 1e-5
    for c in report["contenders"].values():
        assert c["errors"] == 0 and c["score_rows"] == report["items"]
        assert c["items_per_s"] > 0 and c["tokens_per_s"] > 0
    contenders = report["contenders"]
    # the engine reads the reference's prompt, token for token
    assert (
        contenders["engine listwise"]["tokens_per_job"]
        == contenders["transformers reference"]["tokens_per_job"]
    )
    ratios = report["ratios"]
    engine = contenders["engine listwise"]["items_per_s"]
    assert ratios["listwise_over_reference"] == pytest.approx(
        engine / contenders["transformers reference"]["items_per_s"]
    )
    assert ratios["listwise_over_pointwise_mis"] == pytest.approx(
        engine / contenders["engine pointwise MIS"]["items_per_s"]
    )
    for words in (*CONTENDERS, "items/s", "tok/s", "listwise / pointwise MIS"):
        assert words in printed


def _record(scores: list[list[list[float]]]) -> RunRecord:
    return RunRecord(
        scores=scores,  # type: ignore[arg-type]  # the record's Scores rows
        errors=[""] * len(scores),
        latencies=[0.0] * len(scores),
        wall_s=1.0,
        forward_tokens=10,
        lm_head_rows=0,
        peak_bytes=0,
    )


def test_the_cross_check_bites() -> None:
    shape = ListwiseShape(jobs=1, docs_per_job=2)
    want = [[[0.25], [0.5]]]
    runs = {"transformers reference": _record(want), "engine pointwise MIS": _record(want)}
    assert listwise_report({"engine listwise": _record(want), **runs}, shape, SHAPES["tiny"])["ok"]
    off = [[[0.25], [0.5 + 1e-3]]]
    assert not listwise_report({"engine listwise": _record(off), **runs}, shape, SHAPES["tiny"])["ok"]
    missing = [[[0.25]]]
    assert not listwise_report({"engine listwise": _record(missing), **runs}, shape, SHAPES["tiny"])["ok"]


def test_a_full_size_job_fits_both_contexts(tmp_path) -> None:
    """The full workload's jobs are answered by both engine contenders, each job whole: MIS packs a
    job's 32 documents into one sequence (the pointwise checkpoint has Qwen3-Reranker's 40,960 positions,
    so longer documents fit too)."""
    from kafka_scorer.engine.api import Scorer
    from kafka_scorer_bench.listwise import build_checkpoints

    listwise, pointwise = build_checkpoints(tmp_path, SHAPES["tiny"], seed=0)
    [job] = build_listwise_jobs(ListwiseShape(jobs=1))
    options = dict(dtype="float32", device="cpu")
    [lw] = Scorer(str(listwise), **options).score_jobs([job])
    [pw] = Scorer(str(pointwise), template="qwen3-reranker", **options).score_jobs(as_pointwise([job]))
    assert lw.error is None and pw.error is None, (lw.error, pw.error)
    assert len(lw.scores) == len(pw.scores) == len(job.items)
