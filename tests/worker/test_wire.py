"""The worker's edge: headers, ids, reply topic and format, error results and dead-letter copies."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import msgspec

from kafka_scorer.protocol import ErrorCode, Job, Result, decode_result, encode_job
from kafka_scorer.worker.wire import Inbound, Rejected, WireRules, read_record, result_record


@dataclass
class Rec:
    value: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    key: bytes | None = b"k1"
    topic: str = "jobs"
    partition: int = 2
    offset: int = 41
    timestamp: int = 1_700_000_000_000


RULES = WireRules(
    reply_topic="results",
    dead_letter_topic_for=lambda t: f"{t}.DLT",
    max_message_bytes=1000,
    model_name="tiny",
    group_id="g",
)
JOB = Job(query="q", items=["a"], label_token_ids=[1])


def test_job_id_comes_from_the_body_then_the_header_then_the_position() -> None:
    with_id = read_record(Rec(encode_job(Job(query="q", items=[], id="body-id"))), RULES)
    assert isinstance(with_id, Inbound) and with_id.job_id == "body-id"
    from_header = read_record(Rec(encode_job(JOB), [("correlation_id", b"c-7")]), RULES)
    assert isinstance(from_header, Inbound) and from_header.job_id == "c-7"
    positional = read_record(Rec(encode_job(JOB)), RULES)
    assert isinstance(positional, Inbound) and positional.job_id == "jobs:2:41"


def test_reply_keeps_key_format_and_correlation_header_name() -> None:
    """Spring's header names are echoed as they came, so ReplyingKafkaTemplate matches replies."""
    headers = [
        ("kafka_correlationId", b"\x01\x02binary"),
        ("kafka_replyTopic", b"my-replies"),
        ("content-type", b"application/msgpack"),
    ]
    inbound = read_record(Rec(encode_job(JOB, "msgpack"), headers), RULES)
    assert isinstance(inbound, Inbound)
    assert inbound.origin.fmt == "msgpack"
    out = result_record(Result(id="x", scores=[[0.5]]), inbound.origin)
    assert out.topic == "my-replies"
    assert out.key == b"k1"
    assert ("kafka_correlationId", b"\x01\x02binary") in out.headers
    assert ("content-type", b"application/msgpack") in out.headers
    assert msgspec.msgpack.decode(out.value)["scores"] == [[0.5]]


def test_invalid_reply_topic_header_falls_back_with_a_warning() -> None:
    inbound = read_record(Rec(encode_job(JOB), [("reply_topic", b"no spaces allowed")]), RULES)
    assert isinstance(inbound, Inbound)
    out = result_record(Result(id="x", scores=[[0.5]]), inbound.origin)
    assert out.topic == "results"
    assert "not a valid topic name" in decode_result(out.value).warnings[0]


def test_undecodable_record_gets_invalid_message_and_an_untouched_dead_letter_copy() -> None:
    headers = [("content-type", b"application/json"), ("trace", b"\xff\x00")]
    rec = Rec(b"{not json", headers)
    rejected = read_record(rec, RULES)
    assert isinstance(rejected, Rejected)
    assert rejected.result.error is not None
    assert rejected.result.error.code is ErrorCode.INVALID_MESSAGE
    assert rejected.result.id == "jobs:2:41"
    assert rejected.origin.fmt == "json"
    dead = rejected.dead_letter
    assert dead is not None
    assert (dead.topic, dead.key, dead.value) == ("jobs.DLT", b"k1", b"{not json")
    assert dead.headers[:2] == headers  # originals first, unchanged
    extra = dict(dead.headers[2:])
    assert extra["kafka_dlt-original-topic"] == b"jobs"
    assert struct.unpack(">i", extra["kafka_dlt-original-partition"]) == (2,)
    assert struct.unpack(">q", extra["kafka_dlt-original-offset"]) == (41,)
    assert struct.unpack(">q", extra["kafka_dlt-original-timestamp"]) == (1_700_000_000_000,)
    assert b"JSON" in extra["kafka_dlt-exception-message"] or b"json" in extra["kafka_dlt-exception-message"]
    assert extra["kafka_dlt-original-consumer-group"] == b"g"


def test_plain_text_without_content_type_is_undecodable() -> None:
    rejected = read_record(Rec(b"hello there"), RULES)
    assert isinstance(rejected, Rejected) and rejected.result.error is not None
    assert rejected.result.error.code is ErrorCode.INVALID_MESSAGE
    assert rejected.dead_letter is not None
    assert rejected.origin.fmt == "json"  # no header: answer in the default format


def test_schema_violation_is_invalid_request_without_dead_letter_and_keeps_the_id() -> None:
    for value in (
        b'{"id": "bad-1", "query": 5, "items": []}',
        b'{"id": "bad-1", "query": "q", "items": [], "x": 1}',
    ):
        rejected = read_record(Rec(value), RULES)
        assert isinstance(rejected, Rejected) and rejected.result.error is not None
        assert rejected.result.error.code is ErrorCode.INVALID_REQUEST
        assert rejected.result.id == "bad-1"
        assert rejected.dead_letter is None


def test_oversized_record_is_too_long_without_decoding() -> None:
    rejected = read_record(Rec(b"{" + b" " * 2000 + b"}", [("correlation_id", b"big")]), RULES)
    assert isinstance(rejected, Rejected) and rejected.result.error is not None
    assert rejected.result.error.code is ErrorCode.TOO_LONG
    assert rejected.result.id == "big"
    assert rejected.dead_letter is None


def test_tombstone_is_invalid_message() -> None:
    rejected = read_record(Rec(None), RULES)
    assert isinstance(rejected, Rejected) and rejected.result.error is not None
    assert rejected.result.error.code is ErrorCode.INVALID_MESSAGE
    assert rejected.dead_letter is not None and rejected.dead_letter.value is None
    no_key = read_record(Rec(None, key=None), RULES)
    assert isinstance(no_key, Rejected) and no_key.dead_letter is None  # Kafka cannot carry it
