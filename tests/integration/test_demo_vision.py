"""`kafka-scorer demo --template qwen3-vl-reranker` end to end as a child process: jobs whose items
include pictures, through the embedded broker and a worker serving the tiny Qwen3-VL reranker, printed
as rankings that plain transformers (one pair at a time) agrees with."""

from __future__ import annotations

import re

import pytest

from kafka_scorer.checkpoints.tiny_vision import build_tiny_vl_reranker
from kafka_scorer.cli.demo_rerank import rerank_job
from kafka_scorer.engine.load.revision import checkpoint_revision
from kafka_scorer.wire.content import Content, ImagePart
from tests.engine.vision.reference import INSTRUCTION, Reference
from tests.integration.cli_runs import run_demo
from tests.integration.test_demo_rerank import SHORT_JOBS, parse_rankings

pytestmark = pytest.mark.integration


def _parts(value: object) -> list:
    if isinstance(value, Content):
        return [p.image.data if isinstance(p, ImagePart) else p.text for p in value.content]
    return [value]


def test_demo_ranks_pictures_as_transformers_does(tmp_path) -> None:
    path, out, _ = run_demo("qwen3-vl-reranker", lambda: build_tiny_vl_reranker(tmp_path / "vl"))
    assert f"model_revision {checkpoint_revision(str(path))}" in out  # the same bytes: the same model
    rows = parse_rankings(out)
    reference = Reference(path)
    labels = [reference.tokenizer.convert_tokens_to_ids(t) for t in ("yes", "no")]
    pictures = 0
    for n in range(SHORT_JOBS - 1):
        job = rerank_job(n, images=True)
        relevance = []
        for item in job.inputs:
            yes, _ = reference.scores(
                *reference.prompt(_parts(job.query), _parts(item), job.instruction or INSTRUCTION),
                labels,
                apply_softmax=True,
            )
            relevance.append(yes)
        want = sorted(range(len(relevance)), key=lambda i: (-relevance[i], i))[: job.top_n]
        ranked = rows[job.id].ranked
        assert [r[1] for r in ranked] == want, (rows[job.id], relevance)
        for _, index, score, text in ranked:
            assert score == pytest.approx(relevance[index], abs=6e-5)
            pictures += isinstance(job.inputs[index], Content) and text == "[image] a photo"
    assert pictures >= 2, out
    assert re.search(r"bad-job .*ERROR invalid_request", out.replace("│", " ")), out
