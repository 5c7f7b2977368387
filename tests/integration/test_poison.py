"""Poison records: each gets its typed error result (and a dead-letter copy where SPEC §3 says), the
jobs after them are scored normally, and the worker stays up."""

from __future__ import annotations

import struct
from collections import Counter

import msgspec
import pytest

from kafka_scorer.protocol import ErrorCode, Job, encode_job
from tests.integration.jobs import MODEL_VOCAB, assert_answers, mixed_stream
from tests.integration.kafka_helpers import InProcessWorker, Out, decode_replies, produce, read_topic

pytestmark = pytest.mark.integration

JSON = [("content-type", b"application/json")]


def _job(job_id: str, **fields) -> bytes:
    base = {"query": [5, 6, 7], "items": [[8, 9]], "label_token_ids": [1, 2]}
    return msgspec.json.encode({"id": job_id, **base, **fields})


async def test_poison_records_get_typed_errors_and_do_not_stop_the_worker(
    kafka, causal_model, causal_scorer, causal_reference
) -> None:
    # The stream's jobs are the good ones, produced after the poison: they must still be scored.
    stream = await mixed_stream(
        kafka,
        30,
        seed=3,
        model_name=causal_scorer.model_name,
        prefix="after",
        partitions=2,
        dead_letters=True,
    )
    requests = stream.requests
    settings = stream.settings(causal_model, max_message_bytes=1 << 20)
    poison = [
        # (record, expected id, expected code, dead-lettered?)
        (
            Out(requests, b"this is not json", b"k-text", [("trace", b"t1")]),
            f"{requests}:0:0",
            "invalid_message",
            True,
        ),
        (Out(requests, b"{broken", b"k-broken", JSON), f"{requests}:0:1", "invalid_message", True),
        (
            Out(requests, b"\xc1\xc1", b"k-mp", [("content-type", b"application/msgpack")]),
            None,
            "invalid_message",
            True,
        ),
        (Out(requests, None, b"k-tombstone"), None, "invalid_message", True),
        (
            Out(requests, b'{"id": "wrong-types", "query": 5, "items": "x"}', b"k"),
            "wrong-types",
            "invalid_request",
            False,
        ),
        (Out(requests, _job("unknown-field", bogus=1), b"k"), "unknown-field", "invalid_request", False),
        (
            Out(requests, b"{" + b" " * (10 << 20) + b"}", b"k-big", [("correlation_id", b"huge")]),
            "huge",
            "too_long",
            False,
        ),
        (
            Out(requests, _job("label-range", label_token_ids=[1, MODEL_VOCAB]), b"k"),
            "label-range",
            "invalid_request",
            False,
        ),
        (Out(requests, _job("ten-thousand", items=[[8]] * 10_000), b"k"), "ten-thousand", "too_long", False),
        (
            Out(requests, _job("mismatch", model="some-other-model"), b"k"),
            "mismatch",
            "model_mismatch",
            False,
        ),
        (
            Out(requests, _job("mixed-kinds", query="text", items=[[8, 9]]), b"k"),
            "mixed-kinds",
            "invalid_request",
            False,
        ),
    ]
    for record, *_ in poison:
        record.partition = 0
    total = len(poison) + len(stream.sent)

    async with InProcessWorker(settings, causal_scorer) as worker:
        await produce(kafka.bootstrap, [r for r, *_ in poison], max_request_size=12 << 20)
        await produce(kafka.bootstrap, stream.records)
        got = await stream.read_replies(total, timeout_s=60, settle_s=0.3)
        dead = await read_topic(
            kafka.bootstrap, stream.dead_letters, lambda rs: len(rs) >= 4, timeout_s=15, settle_s=0.3
        )
        committed, ends = await stream.wait_for_commits(total)
        assert worker.running, "the worker must survive poison records"
        metrics = worker.worker.metrics
        dead_lettered = metrics.dead_letters._value.get()
        errors_by_code = {code: metrics.errors.labels(code=code)._value.get() for _, _, code, _ in poison}
        assert await worker.stop() == 0

    results = decode_replies(got)
    assert len(results) == total
    by_id = {r.id: r for r in results}
    errors = [r for r in results if r.error is not None]
    assert len(errors) == len(poison)
    for _record, job_id, code, _ in poison:
        if job_id is None:
            continue
        result = by_id[job_id]
        assert result.error is not None and result.error.code == ErrorCode(code), (job_id, result.error)
        assert result.scores is None
    assert sorted(r.error.code.value for r in errors) == sorted(code for *_, code, _ in poison)

    assert dead_lettered == sum(1 for *_, dlt in poison if dlt)
    assert errors_by_code == dict(Counter(code for _, _, code, _ in poison))
    # The dead-letter topic holds exactly the undecodable records, untouched, with where-from headers.
    sent_dead = {r.key: r for r, *_, dlt in poison if dlt}
    assert sorted(d.key for d in dead) == sorted(sent_dead)
    for copy in dead:
        original = sent_dead[copy.key]
        assert copy.value == original.value
        headers = list(copy.headers)
        assert headers[: len(original.headers)] == original.headers
        extra = dict(headers[len(original.headers) :])
        assert extra["kafka_dlt-original-topic"] == requests.encode()
        assert struct.unpack(">i", extra["kafka_dlt-original-partition"]) == (0,)
        assert struct.unpack(">q", extra["kafka_dlt-original-offset"])[0] in range(len(poison))
        assert extra["kafka_dlt-exception-message"]

    assert_answers([r for r in results if r.error is None], stream.sent, causal_reference)
    assert committed == ends


def test_job_fixture_is_valid() -> None:
    """Guard for the test itself: the base job the poison variants start from is a valid job."""
    assert msgspec.json.decode(_job("x"), type=Job) == Job(
        id="x", query=[5, 6, 7], items=[[8, 9]], label_token_ids=[1, 2]
    )
    assert encode_job(Job(query="q", items=[]))
