"""A Qwen3-VL reranker served by the worker through a real broker (SPEC §11): image jobs from the
client (MessagePack, raw image bytes) and from `kafka-scorer submit` (JSON Lines, a data URI) answered
with the scores plain transformers gives one pair at a time, and a job with a broken image answered
`invalid_request` beside them."""

from __future__ import annotations

import base64
import json

import msgspec
import pytest

from kafka_scorer.client import ScoringClient
from kafka_scorer.wire.protocol import ErrorCode, Job, Result
from tests.engine.vision.images import picture
from tests.engine.vision.reference import Reference
from tests.integration.cli_runs import run_cli
from tests.integration.kafka_helpers import InProcessWorker, fresh_topics

pytestmark = pytest.mark.integration

RED, BLUE = picture(50, 40, seed=1), picture(33, 70, seed=2)


def _data_uri(image: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image).decode()


def _relevance(reference: Reference, query: list, document: list, labels: list[int]) -> float:
    yes, no = reference.scores(*reference.prompt(query, document), labels)
    return yes / (yes + no)  # the model card's sigmoid(logit_yes - logit_no)


async def test_the_worker_answers_image_rerank_jobs_from_the_client_and_submit(kafka, tmp_path) -> None:
    from kafka_scorer.checkpoints.tiny_vision import build_tiny_vl_reranker
    from kafka_scorer.engine.scorer import Scorer

    path = build_tiny_vl_reranker(tmp_path / "vl")
    scorer = Scorer(str(path), dtype="float32", device="cpu", template="qwen3-vl-reranker")
    reference = Reference(path)
    labels = [reference.tokenizer.convert_tokens_to_ids(t) for t in ("yes", "no")]
    topics = await fresh_topics(kafka, partitions=1)
    image_document = {"content": [{"type": "image", "image": RED}, {"type": "text", "text": "a photo"}]}
    submitted = {
        "id": "from-submit",
        "query": {"content": [{"type": "image", "image": _data_uri(BLUE)}]},
        "documents": [
            "a blue sky",
            {"content": [{"type": "image", "image": _data_uri(RED)}, {"type": "text", "text": "red"}]},
        ],
        "top_n": 2,
    }
    jobs_file = tmp_path / "jobs.jsonl"
    jobs_file.write_text(json.dumps(submitted) + "\n")
    out_file = tmp_path / "results.jsonl"
    client = ScoringClient(
        kafka.bootstrap, topics.requests, topics.replies, fetch_max_wait_ms=20, format="msgpack"
    )
    async with InProcessWorker(topics.settings(path, template="qwen3-vl-reranker"), scorer.engine), client:
        reranked = await client.request(
            Job(id="from-client", query="which is red?", documents=["a blue sky", image_document], top_n=2)
        )
        broken = await client.request(
            Job(id="broken", query="q", documents=[{"content": [{"type": "image", "image": RED[:100]}]}])
        )
        rc, _, stderr = await run_cli(
            "submit", str(jobs_file), "-o", str(out_file), "--bootstrap-servers", kafka.bootstrap,
            "--request-topic", topics.requests, "--reply-topic", topics.replies, "--timeout", "60",
            "--no-progress",
        )  # fmt: skip
    assert reranked.error is None, reranked.error
    want = [
        _relevance(reference, ["which is red?"], ["a blue sky"], labels),
        _relevance(reference, ["which is red?"], [RED, "a photo"], labels),
    ]
    assert reranked.results is not None
    assert [entry.index for entry in reranked.results] == sorted(range(2), key=lambda i: -want[i])
    for entry in reranked.results:
        assert entry.relevance_score == pytest.approx(want[entry.index], abs=1e-4)
    assert broken.error is not None and broken.error.code is ErrorCode.INVALID_REQUEST
    assert "truncated" in broken.error.message and broken.error.item == 0
    assert rc == 0, stderr
    [from_submit] = [msgspec.json.decode(line, type=Result) for line in out_file.read_bytes().splitlines()]
    assert from_submit.id == "from-submit" and from_submit.results is not None
    documents = [["a blue sky"], [RED, "red"]]
    for entry in from_submit.results:
        want_score = _relevance(reference, [BLUE], documents[entry.index], labels)
        assert entry.relevance_score == pytest.approx(want_score, abs=1e-4)
    assert "[image] red" in stderr  # the summary's ranking shows the image document
