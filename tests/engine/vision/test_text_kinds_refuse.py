"""Every job shape works on every kind or is refused with a typed error: a text-only model answers a
job with content parts `unsupported`, and the text jobs beside it are scored as before."""

from __future__ import annotations

import pytest

from kafka_scorer.client.arguments import job_from_fields
from kafka_scorer.wire.content import Content, ImageData, ImagePart, TextPart
from kafka_scorer.wire.protocol import ErrorCode, Job
from tests.engine.vision.images import picture

IMAGE = Content([TextPart("a photo"), ImagePart(ImageData(picture()))])


def _content_jobs() -> list[Job]:
    return [
        Job(id="query", query=IMAGE, items=["a", "b"]),
        Job(id="item", query="q", items=["a", IMAGE]),
        Job(id="document", query="q", documents=["a", {"content": [{"type": "image", "image": picture()}]}]),
    ]


def _assert_refused_beside_a_text_job(scorer, text_job: Job) -> None:
    results = scorer.score_jobs([*_content_jobs(), text_job])
    for result in results[:-1]:
        assert result.error is not None and result.error.code is ErrorCode.UNSUPPORTED, result
        assert "vision-language" in result.error.message
        assert result.model == scorer.describe().model_name
    assert results[-1].ok and results[-1].scores


@pytest.mark.parametrize("kind", ["causal", "classification"])
def test_a_decoder_refuses_images(scorer_for, kind: str) -> None:
    labels = [3, 4] if kind == "causal" else None
    _assert_refused_beside_a_text_job(
        scorer_for("qwen3", kind), Job(id="text", query="q", items=["a"], label_token_ids=labels)
    )


def test_a_cross_encoder_refuses_images(tiny_encoder) -> None:
    from kafka_scorer.engine.scorer import Scorer

    scorer = Scorer(str(tiny_encoder("bert")), dtype="float32", device="cpu")
    _assert_refused_beside_a_text_job(scorer, Job(id="text", query="q", items=["a"]))


def test_a_late_interaction_model_refuses_images(colbert_scorer) -> None:
    _assert_refused_beside_a_text_job(colbert_scorer(), Job(id="text", query="q", items=["a"]))


def test_the_client_builds_image_jobs_from_plain_values() -> None:
    """`ScoringClient.score` takes parts as dicts with raw bytes, the way a caller writes them."""
    job = job_from_fields(
        {"content": [{"type": "image", "image": picture()}, {"type": "text", "text": "red"}]},
        ["a", {"content": [{"type": "image", "image": "data:image/png;base64,iVBORw0KGgo="}]}],
        {"id": "x"},
    )
    assert isinstance(job.query, Content) and job.query.images[0].data == picture()
    assert isinstance(job.items[1], Content)  # type: ignore[index]
