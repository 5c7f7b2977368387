"""Qwen2-VL checkpoints (the family of MonoQwen2-VL and jina-reranker-m0's base: no deepstack
features, 14-pixel patches, M-RoPE not interleaved) and Qwen2.5-VL ones (a windowed vision tower) are
served by the same kind, their scores equal transformers one pair at a time, MIS on and off, with the
image-feature cache."""

from __future__ import annotations

import msgspec
import pytest

from kafka_scorer.wire.protocol import Job
from tests.engine.vision.reference import Reference
from tests.engine.vision.test_vision_scores import JOBS, assert_close, expected


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def qwen2(request, tmp_path_factory):
    from kafka_scorer.checkpoints.tiny_vision import build_tiny_vl_reranker
    from kafka_scorer.engine.scorer import Scorer

    path = build_tiny_vl_reranker(tmp_path_factory.mktemp(request.param), family=request.param)
    scorer = Scorer(str(path), dtype="float32", device="cpu", template="qwen3-vl-reranker")
    reference = Reference(path)
    labels = [reference.tokenizer.convert_tokens_to_ids(t) for t in ("yes", "no")]
    return scorer, reference, labels


def test_the_checkpoint_is_served_by_the_vision_kind(qwen2) -> None:
    scorer, reference, _ = qwen2
    assert reference.model.config.model_type in ("qwen2_vl", "qwen2_5_vl")
    assert scorer.describe().kind.reads_images and type(scorer.describe().loaded.body) is type(
        reference.model.model
    )


@pytest.mark.parametrize("name", list(JOBS))
def test_scores_equal_transformers_pair_by_pair(qwen2, name: str) -> None:
    scorer, reference, labels = qwen2
    want = expected(reference, JOBS[name], labels)
    jobs: list[Job] = [JOBS[name], msgspec.structs.replace(JOBS[name], multi_item=False)]
    for job, result in zip(jobs, [*scorer.score_jobs(jobs[:1]), *scorer.score_jobs(jobs[1:])]):
        assert result.ok, (job.multi_item, result.error)
        assert_close(result.scores, want)
