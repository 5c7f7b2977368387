"""Content parts on the wire (SPEC §11): JSON with base64 or a data URI, MessagePack with raw bytes,
and every malformed image value `invalid_request` at decode time."""

from __future__ import annotations

import base64

import msgspec
import pytest

from kafka_scorer.wire.content import Content, ImageData, ImagePart, TextPart
from kafka_scorer.wire.protocol import ErrorCode, Job, MessageDecodeError, decode_job, encode_job
from tests.engine.vision.images import picture

PNG = picture()


def job_with(image_value: object, fmt: str = "json") -> bytes:
    body = {
        "query": {
            "content": [{"type": "text", "text": "a red car"}, {"type": "image", "image": image_value}]
        },
        "items": ["x"],
    }
    return (msgspec.json if fmt == "json" else msgspec.msgpack).encode(body)


@pytest.mark.parametrize(
    ("value", "declared"),
    [
        (base64.b64encode(PNG).decode(), None),
        ("data:image/png;base64," + base64.b64encode(PNG).decode(), "image/png"),
        ("data:;base64," + base64.b64encode(PNG).decode(), None),
    ],
)
def test_json_takes_base64_and_data_uris(value: str, declared: str | None) -> None:
    job, _ = decode_job(job_with(value))
    assert isinstance(job.query, Content)
    assert job.query.content[0] == TextPart("a red car")
    assert job.query.images == [ImageData(PNG, declared)]


def test_msgpack_carries_raw_bytes_without_base64() -> None:
    raw = job_with(PNG, "msgpack")
    assert PNG in raw  # no inflation: the image's bytes are in the record as they are
    job, fmt = decode_job(raw)
    assert fmt == "msgpack" and job.query.images[0].data == PNG  # type: ignore[union-attr]


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_encoding_round_trips(fmt: str) -> None:
    job = Job(query="q", items=[Content([ImagePart(ImageData(PNG)), TextPart("caption")]), "plain"])
    again, _ = decode_job(encode_job(job, fmt))  # type: ignore[arg-type]
    assert again.items == job.items


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("https://example.com/cat.png", "URLs are not fetched"),
        ("file:///etc/passwd", "URLs are not fetched"),
        ("not base64!", "not valid base64"),
        ("data:image/png,rawtext", "must be base64"),
        (12, "expected image bytes"),
    ],
)
def test_bad_image_values_are_invalid_requests(value: object, why: str) -> None:
    with pytest.raises(MessageDecodeError) as caught:
        decode_job(job_with(value))
    assert caught.value.code is ErrorCode.INVALID_REQUEST
    assert why in str(caught.value)


def test_an_unknown_part_type_is_an_invalid_request() -> None:
    body = msgspec.json.encode({"query": {"content": [{"type": "video", "video": "x"}]}, "items": ["x"]})
    with pytest.raises(MessageDecodeError) as caught:
        decode_job(body)
    assert caught.value.code is ErrorCode.INVALID_REQUEST


def test_submit_reads_image_jobs_from_json_lines() -> None:
    from kafka_scorer.cli.submit import read_jobs

    line = job_with("data:image/png;base64," + base64.b64encode(PNG).decode()).decode()
    submissions, problems = read_jobs([line, job_with("https://example.com/x.png").decode()])
    assert len(submissions) == 1 and submissions[0].job.query.images[0].data == PNG  # type: ignore[union-attr]
    assert len(problems) == 1 and problems[0].startswith("line 2:") and "not fetched" in problems[0]
