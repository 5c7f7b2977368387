"""The worker's edge: headers, ids, reply topic and format, error results and dead-letter copies."""

from __future__ import annotations

import struct
from dataclasses import replace

import msgspec
import pytest

from kafka_scorer.wire.protocol import ErrorCode, Job, Result, decode_result, encode_job
from kafka_scorer.worker.envelope import Inbound, RecordCodec, Rejected
from tests.worker.conftest import Rec

CODEC = RecordCodec(
    reply_topic="results",
    dead_letter_topic_for=lambda t: f"{t}.DLT",
    max_message_bytes=1000,
    model_name="tiny",
    group_id="g",
)
JOB = Job(query="q", items=["a"], label_token_ids=[1])


def test_job_id_comes_from_the_body_then_the_header_then_the_position() -> None:
    with_id = CODEC.decode_record(Rec(encode_job(Job(query="q", items=[], id="body-id"))))
    assert isinstance(with_id, Inbound) and with_id.job_id == "body-id"
    from_header = CODEC.decode_record(Rec(encode_job(JOB), [("correlation_id", b"c-7")]))
    assert isinstance(from_header, Inbound) and from_header.job_id == "c-7"
    positional = CODEC.decode_record(Rec(encode_job(JOB)))
    assert isinstance(positional, Inbound) and positional.job_id == "jobs:2:41"


def test_reply_keeps_key_format_and_correlation_header_name() -> None:
    """Spring's header names are echoed as they came, so ReplyingKafkaTemplate matches replies."""
    headers = [
        ("kafka_correlationId", b"\x01\x02binary"),
        ("kafka_replyTopic", b"my-replies"),
        ("content-type", b"application/msgpack"),
    ]
    inbound = CODEC.decode_record(Rec(encode_job(JOB, "msgpack"), headers))
    assert isinstance(inbound, Inbound)
    assert inbound.origin.fmt == "msgpack"
    out = CODEC.encode_record(Result(id="x", scores=[[0.5]]), inbound.origin)
    assert out.topic == "my-replies"
    assert out.key == b"k1"
    assert ("kafka_correlationId", b"\x01\x02binary") in out.headers
    assert ("content-type", b"application/msgpack") in out.headers
    assert msgspec.msgpack.decode(out.value)["scores"] == [[0.5]]


def test_invalid_reply_topic_header_falls_back_with_a_warning() -> None:
    inbound = CODEC.decode_record(Rec(encode_job(JOB), [("reply_topic", b"no spaces allowed")]))
    assert isinstance(inbound, Inbound)
    out = CODEC.encode_record(Result(id="x", scores=[[0.5]]), inbound.origin)
    assert out.topic == "results"
    assert "not a valid topic name" in decode_result(out.value).warnings[0]


def test_undecodable_record_gets_invalid_message_and_an_untouched_dead_letter_copy() -> None:
    headers = [("content-type", b"application/json"), ("trace", b"\xff\x00")]
    rec = Rec(b"{not json", headers)
    rejected = CODEC.decode_record(rec)
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
    rejected = CODEC.decode_record(Rec(b"hello there"))
    assert isinstance(rejected, Rejected) and rejected.result.error is not None
    assert rejected.result.error.code is ErrorCode.INVALID_MESSAGE
    assert rejected.dead_letter is not None
    assert rejected.origin.fmt == "json"  # no header: answer in the default format


def test_schema_violation_is_invalid_request_without_dead_letter_and_keeps_the_id() -> None:
    for value in (
        b'{"id": "bad-1", "query": 5, "items": []}',
        b'{"id": "bad-1", "query": "q", "items": [], "x": 1}',
    ):
        rejected = CODEC.decode_record(Rec(value))
        assert isinstance(rejected, Rejected) and rejected.result.error is not None
        assert rejected.result.error.code is ErrorCode.INVALID_REQUEST
        assert rejected.result.id == "bad-1"
        assert rejected.dead_letter is None


def test_oversized_record_is_too_long_without_decoding() -> None:
    rejected = CODEC.decode_record(Rec(b"{" + b" " * 2000 + b"}", [("correlation_id", b"big")]))
    assert isinstance(rejected, Rejected) and rejected.result.error is not None
    assert rejected.result.error.code is ErrorCode.TOO_LONG
    assert rejected.result.id == "big"
    assert rejected.dead_letter is None


def test_tombstone_is_invalid_message() -> None:
    rejected = CODEC.decode_record(Rec(None))
    assert isinstance(rejected, Rejected) and rejected.result.error is not None
    assert rejected.result.error.code is ErrorCode.INVALID_MESSAGE
    assert rejected.dead_letter is not None and rejected.dead_letter.value is None
    no_key = CODEC.decode_record(Rec(None, key=None))
    assert isinstance(no_key, Rejected) and no_key.dead_letter is None  # Kafka cannot carry it


# ---- poison-proof intake (issue 12) --------------------------------------------------------------

MSGPACK = [("content-type", b"application/msgpack")]


def _assert_undecodable(rejected: Inbound | Rejected, value: bytes | None) -> None:
    """`invalid_message`, answered by position, with an untouched dead-letter copy."""
    assert isinstance(rejected, Rejected), rejected
    assert rejected.result.error is not None
    assert rejected.result.error.code is ErrorCode.INVALID_MESSAGE, rejected.result.error
    assert rejected.dead_letter is not None and rejected.dead_letter.value == value


def test_invalid_utf8_inside_a_msgpack_string_is_invalid_message_not_a_crash() -> None:
    """The record that used to end the worker with UnicodeDecodeError, byte for byte."""
    value = b"\x81\xa5query\xa2\xff\xfe"
    rejected = CODEC.decode_record(Rec(value))
    _assert_undecodable(rejected, value)
    assert "UTF-8" in rejected.result.error.message  # type: ignore[union-attr]


def test_invalid_utf8_inside_a_json_string_is_invalid_message() -> None:
    value = b'{"id": "u", "query": "\xff\xfe", "items": []}'
    _assert_undecodable(CODEC.decode_record(Rec(value)), value)


def test_ten_thousand_deep_nesting_is_invalid_message_not_a_recursion_error() -> None:
    deep_json = b"[" * 10_000 + b"]" * 10_000
    unknown_field = b'{"id": "deep", "z": ' + deep_json + b"}"  # used to blow up in the id salvage
    deep_msgpack = b"\x81\xa1z" + b"\x91" * 10_000 + b"\x90"
    for value, headers in ((deep_json, []), (unknown_field, []), (deep_msgpack, MSGPACK)):
        rejected = replace(CODEC, max_message_bytes=1 << 20).decode_record(Rec(value, headers))
        _assert_undecodable(rejected, value)
        assert "nested too deeply" in rejected.result.error.message  # type: ignore[union-attr]


def test_mislabelled_bodies_are_invalid_message_with_a_dead_letter_copy() -> None:
    """msgspec reports a type error before it reaches the garbage; the worker must not believe it."""
    cases = [
        (b"12 garbage", [("content-type", b"application/json")]),
        (encode_job(JOB), MSGPACK),  # a JSON body labelled MessagePack
        (bytes.fromhex("05c1d9ffee00aa"), MSGPACK),  # random bytes labelled MessagePack
    ]
    for value, headers in cases:
        _assert_undecodable(CODEC.decode_record(Rec(value, headers)), value)


def test_an_early_invalid_timestamp_cannot_hide_invalid_utf8_behind_it() -> None:
    """Found by the fuzzer: the well-formedness check stopped at a bad timestamp extension and called
    the record a schema error, with invalid UTF-8 further on. Both make the value undecodable."""
    value = b"\x82\xa0\x91\xc7\x00\xff\xa5query\xa7\xffaaaaaa"
    _assert_undecodable(CODEC.decode_record(Rec(value, MSGPACK)), value)
    alone = b"\x81\xa0\xc7\x00\xff"  # a timestamp of length 0: not a valid MessagePack timestamp
    _assert_undecodable(CODEC.decode_record(Rec(alone)), alone)


def test_well_formed_documents_that_break_the_schema_stay_invalid_request() -> None:
    """The well-formedness check must not turn schema errors into dead letters."""
    for value, headers in (
        (b'{"id": "big", "query": [1e400], "items": []}', []),  # well-formed JSON, number out of range
        (b'{"id": "big", "query": [1, "two"], "items": []} ', []),
        (msgspec.msgpack.encode({"id": "ext", "query": msgspec.msgpack.Ext(7, b"x"), "items": []}), []),
        (msgspec.msgpack.encode({"id": "nan", "query": [float("nan")], "items": []}), MSGPACK),
    ):
        rejected = CODEC.decode_record(Rec(value, headers))
        assert isinstance(rejected, Rejected) and rejected.result.error is not None
        assert rejected.result.error.code is ErrorCode.INVALID_REQUEST, (value, rejected.result.error)
        assert rejected.dead_letter is None
        assert rejected.result.id in ("big", "ext", "nan")


def test_headers_over_the_cap_are_invalid_request_and_not_echoed() -> None:
    huge = b"c" * 2000
    codec = replace(CODEC, max_header_bytes=1000)
    value = encode_job(Job(query="q", items=["a"], id="body-id"))
    headers = [("correlation_id", huge), ("reply_topic", b"elsewhere"), ("content-type", b"application/json")]
    rejected = codec.decode_record(Rec(value, headers))
    assert isinstance(rejected, Rejected) and rejected.result.error is not None
    assert rejected.result.error.code is ErrorCode.INVALID_REQUEST
    assert "max_header_bytes=1000" in rejected.result.error.message
    assert rejected.result.id == "body-id"  # the body's id: the correlation header is not read
    assert rejected.dead_letter is None
    out = CODEC.encode_record(rejected.result, rejected.origin)
    assert out.topic == "results"
    assert all(name != "correlation_id" for name, _ in out.headers)
    assert len(out.value) < 1000
    honoured = replace(codec, max_header_bytes=4000).decode_record(Rec(value, headers))  # under the cap
    assert isinstance(honoured, Inbound) and honoured.origin.reply_topic == "elsewhere"


def test_duplicated_headers_first_one_wins() -> None:
    headers = [
        ("correlation_id", b"first"),
        ("reply_topic", b"replies-a"),
        ("correlation_id", b"second"),
        ("reply_topic", b"replies-b"),
    ]
    inbound = CODEC.decode_record(Rec(encode_job(JOB), headers))
    assert isinstance(inbound, Inbound)
    assert inbound.job_id == "first"
    out = CODEC.encode_record(Result(id="x", scores=[[0.5]]), inbound.origin)
    assert out.topic == "replies-a"
    assert [v for n, v in out.headers if n == "correlation_id"] == [b"first"]


def test_headers_that_are_not_utf8_do_not_break_the_record() -> None:
    headers = [
        ("correlation_id", b"\xff\xfe\x00"),
        ("reply_topic", b"\xff\xfe"),
        ("content-type", b"\xc3\x28"),
        ("trace", None),
    ]
    inbound = CODEC.decode_record(Rec(encode_job(JOB), headers))  # type: ignore[arg-type]
    assert isinstance(inbound, Inbound)
    assert inbound.job_id == "fffe00"  # binary correlation ids become hex
    out = CODEC.encode_record(Result(id="x", scores=[[0.5]]), inbound.origin)
    assert out.topic == "results"
    assert "not a valid topic name" in decode_result(out.value).warnings[0]


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_schema_registry_framed_jobs_are_unwrapped(fmt) -> None:
    """Confluent framing: magic byte 0, a 4-byte schema id, then the payload (JSON Schema serializer)."""
    from kafka_scorer.wire.protocol import decode_job

    job = Job(id="framed", query="q", items=["a", "b"], label_token_ids=[1])
    framed = b"\x00" + (1234).to_bytes(4, "big") + encode_job(job, fmt)
    decoded, got_fmt = decode_job(framed, None)
    assert decoded == job and got_fmt == fmt


@pytest.mark.parametrize("payload", [b"", b"\x0a\x03abc", b"not json"])
def test_a_framed_record_with_an_unreadable_payload_is_invalid_message(payload: bytes) -> None:
    from kafka_scorer.wire.protocol import MessageDecodeError, decode_job

    with pytest.raises(MessageDecodeError) as info:
        decode_job(b"\x00\x00\x00\x00\x07" + payload, "application/json")
    assert info.value.code is ErrorCode.INVALID_MESSAGE


@pytest.mark.parametrize(
    ("value", "content_type", "code", "job_id", "fmt"),
    [
        (b"hello there", None, ErrorCode.INVALID_MESSAGE, None, "json"),  # the bytes cannot say: JSON
        (b"hello there", "application/msgpack", ErrorCode.INVALID_MESSAGE, None, "msgpack"),  # declared
        (None, "application/msgpack", ErrorCode.INVALID_MESSAGE, None, "msgpack"),  # a tombstone
        (b'{"id": "j9", "query": 1}', None, ErrorCode.INVALID_REQUEST, "j9", "json"),  # sniffed
        (b"\x82\xa2id\xa2j8\xa5query\x01", None, ErrorCode.INVALID_REQUEST, "j8", "msgpack"),
        # a content type that names neither format: the default, as with no header
        (b"hello there", "text/plain", ErrorCode.INVALID_MESSAGE, None, "json"),
        # registry framing (a zero byte first) hides nothing: the framed document's own format
        (
            b"\x00\x00\x00\x04\xd2" + b'{"id": "j7", "query": 1}',
            None,
            ErrorCode.INVALID_REQUEST,
            "j7",
            "json",
        ),
        (
            b"\x00\x00\x00\x04\xd2\x82\xa2id\xa2j6\xa5query\x01",
            None,
            ErrorCode.INVALID_REQUEST,
            "j6",
            "msgpack",
        ),
    ],
)
def test_the_decoder_answers_a_typed_failure_with_the_reply_format(
    value, content_type, code, job_id, fmt
) -> None:
    """The codec calls `read_job` once and asks nothing more: the failure names its code, the id the
    document still gave, and the format the error reply goes out in."""
    from kafka_scorer.wire.protocol import Undecodable, read_job

    failure = read_job(value, content_type)
    assert isinstance(failure, Undecodable)
    assert (failure.code, failure.job_id, failure.fmt) == (code, job_id, fmt)
    assert failure.message


def test_the_decoder_answers_a_job_with_its_format() -> None:
    from kafka_scorer.wire.protocol import read_job

    assert read_job(encode_job(JOB, "msgpack"), None) == (JOB, "msgpack")
