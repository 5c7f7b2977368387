"""A hybrid linear-attention checkpoint (Qwen3.5) made by `kafka-scorer model` and served by the worker
through a real broker (issue 38's end-to-end promise): jobs sent together, so the worker packs them into
shared batches, each answered with the scores plain transformers gives each (query, item) pair alone —
MIS and pairs, a job and its reversed copy. A Gated DeltaNet state leaking across a batch's sequences
or an MIS item's neighbours moves these scores by far more than the tolerance (issue 38's 1.7e-2)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from kafka_scorer.client import ScoringClient
from kafka_scorer.wire.protocol import Job
from tests.engine.reference import reference_scores
from tests.integration.kafka_helpers import InProcessWorker, fresh_topics

pytestmark = pytest.mark.integration


def _needs_hybrids() -> None:
    import transformers
    from packaging.version import Version

    from kafka_scorer.engine.recurrent.detection import PASSES_LAYER_KWARGS

    if Version(transformers.__version__) < Version(PASSES_LAYER_KWARGS):
        pytest.skip(f"hybrids are refused at load below transformers {PASSES_LAYER_KWARGS}")


def _jobs(labels: list[int]) -> list[Job]:
    common = {"label_token_ids": labels, "apply_softmax": True}
    jobs = [
        Job(id="mis", query="Is this review positive?", items=["Great food.", "Cold, late.", ""], **common),
        Job(
            id="pairs",
            query="Is this review positive?",
            items=["Friendly staff, long wait", "x"],
            multi_item=False,
            **common,
        ),
        Job(
            id="tokens", query=list(range(3, 40)), items=[[7], list(range(10, 30))], multi_item=True, **common
        ),
    ]
    return jobs + [msgspec.structs.replace(job, id=job.id + "-rev", items=job.items[::-1]) for job in jobs]


async def test_the_worker_serves_a_qwen35_checkpoint_made_by_the_model_command(kafka, tmp_path) -> None:
    _needs_hybrids()
    from kafka_scorer.cli import main as cli_main
    from kafka_scorer.engine.scorer import Scorer

    path = tmp_path / "qwen3.5"
    assert cli_main(["model", "qwen3.5", str(path)]) == 0
    scorer = Scorer(str(path), dtype="float32", device="cpu")
    topics = await fresh_topics(kafka, partitions=1)
    client = ScoringClient(kafka.bootstrap, topics.requests, topics.replies, fetch_max_wait_ms=20)
    jobs = _jobs([5, 6])
    async with InProcessWorker(topics.settings(path), scorer.engine), client:
        results = await asyncio.gather(*(client.request(job) for job in jobs))
    for job, result in zip(jobs, results):
        assert result.error is None, (job.id, result.error)
        want = reference_scores(path, job.query, job.items, job.label_token_ids, job.apply_softmax)
        assert len(result.scores) == len(want), job.id
        for got_row, want_row in zip(result.scores, want):
            assert got_row == pytest.approx(want_row, abs=1e-5), job.id
