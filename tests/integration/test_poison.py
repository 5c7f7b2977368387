"""Poison records: each gets its typed error result (and a dead-letter copy where SPEC §3 says), the
jobs after them are scored normally, and the worker stays up."""

from __future__ import annotations

import asyncio
import dataclasses
import struct
import time
from collections import Counter

import msgspec
import pytest

from kafka_scorer.wire.protocol import ErrorCode, Job, encode_job
from tests.integration.brokers import on_each_broker
from tests.integration.jobs import MODEL_VOCAB, assert_answers, mixed_stream
from tests.integration.kafka_helpers import (
    InProcessWorker,
    Out,
    committed_offsets,
    decode_replies,
    produce,
    read_topic,
)
from tests.integration.raw_records import produce_with_raw_header

pytestmark = pytest.mark.integration

JSON = [("content-type", b"application/json")]


def _job(job_id: str | None, **fields) -> bytes:
    base = {"query": [5, 6, 7], "items": [[8, 9]], "label_token_ids": [1, 2]}
    return msgspec.json.encode({"id": job_id, **base, **fields})


@on_each_broker()
async def test_poison_records_get_typed_errors_and_do_not_stop_the_worker(
    kafka, causal_model, causal_scorer, causal_reference
) -> None:
    # The stream's jobs are the good ones, produced after the poison: they must still be scored.
    stream = await mixed_stream(
        kafka,
        30,
        seed=3,
        model_name=causal_scorer.describe().model_name,
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

    async with InProcessWorker(settings, causal_scorer.engine) as worker:
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
    # provenance on every result (SPEC §8), also on those the worker answered without the engine
    assert causal_scorer.engine.served.revision.startswith("sha256:")
    assert {(r.model_revision, r.dtype) for r in results} == {
        (causal_scorer.engine.served.revision, "float32")
    }
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


# ---- issue 12: records that used to stop the worker, and head-of-line stalls ----------------------

MSGPACK = [("content-type", b"application/msgpack")]


def _keyed(records) -> dict[bytes, list]:
    """Replies by the request's key (the worker answers with the request's key, SPEC §3)."""
    out: dict[bytes, list] = {}
    for r in records:
        out.setdefault(r.key, []).append(decode_replies([r])[0])
    return out


@on_each_broker()
async def test_records_that_used_to_be_fatal_get_typed_answers_between_valid_jobs(
    kafka, causal_model, causal_scorer, causal_reference
) -> None:
    stream = await mixed_stream(
        kafka,
        16,
        seed=12,
        model_name=causal_scorer.describe().model_name,
        prefix="mid",
        partitions=2,
        dead_letters=True,
    )
    requests = stream.requests
    deep = b"[" * 10_000 + b"]" * 10_000
    # (record, expected code, dead-lettered?); keys name them, replies come back under the same key
    hostile = [
        (Out(requests, b"\x81\xa5query\xa2\xff\xfe", b"h-utf8-msgpack"), "invalid_message", True),
        (Out(requests, b'{"query": "\xff\xfe", "items": []}', b"h-utf8-json", JSON), "invalid_message", True),
        (Out(requests, b'{"id": "d", "x": ' + deep + b"}", b"h-deep"), "invalid_message", True),
        (Out(requests, b"12 garbage", b"h-garbage", JSON), "invalid_message", True),
        (Out(requests, _job("json-as-mp"), b"h-json-as-msgpack", MSGPACK), "invalid_message", True),
        (
            Out(requests, bytes.fromhex("05c1d9ffee00aa"), b"h-random-msgpack", MSGPACK),
            "invalid_message",
            True,
        ),
        (
            Out(requests, _job("big-corr"), b"h-big-corr", [("correlation_id", b"c" * (1 << 20))]),
            "invalid_request",
            False,
        ),
        (Out(requests, _job("labels", label_token_ids=list(range(300))), b"h-labels"), "too_long", False),
    ]
    # Odd headers on a valid job: it is scored, its binary correlation id becomes its hex id.
    odd_headers = [("correlation_id", b"\xff\x01"), ("correlation_id", b"second"), ("reply_topic", b"\xfe")]
    odd = Out(requests, _job(None), b"h-odd-headers", odd_headers)
    valid = stream.records
    mixed: list[Out] = []
    for i, record in enumerate(valid):
        mixed.append(record)
        if i < len(hostile):
            hostile[i][0].partition = record.partition
            mixed.append(hostile[i][0])
    odd.partition = 1
    mixed.append(odd)
    total = len(mixed)

    settings = stream.settings(causal_model)
    async with InProcessWorker(settings, causal_scorer.engine) as worker:
        await produce(kafka.bootstrap, mixed, max_request_size=4 << 20)
        got = await stream.read_replies(total, timeout_s=60, settle_s=0.3)
        dead = await read_topic(
            kafka.bootstrap, stream.dead_letters, lambda rs: len(rs) >= 6, timeout_s=15, settle_s=0.3
        )
        committed, ends = await stream.wait_for_commits(total)
        assert worker.running, "no record may stop the worker"
        assert await worker.stop() == 0

    by_key = _keyed(got)
    assert sum(len(v) for v in by_key.values()) == total
    for record, code, _ in hostile:
        (result,) = by_key[record.key]
        assert result.error is not None and result.error.code == ErrorCode(code), (record.key, result.error)
    big = by_key[b"h-big-corr"][0]
    assert big.id == "big-corr" and "max_header_bytes" in big.error.message
    assert all(name != "correlation_id" for r in got if r.key == b"h-big-corr" for name, _ in r.headers)
    (odd_result,) = by_key[b"h-odd-headers"]
    assert odd_result.error is None and odd_result.id == "ff01"
    assert sorted(d.key for d in dead) == sorted(r.key for r, _, dlt in hostile if dlt)
    assert all(d.value == next(r.value for r, *_ in hostile if r.key == d.key) for d in dead)
    assert_answers(
        [r for k, rs in by_key.items() if k.startswith(b"key-") for r in rs], stream.sent, causal_reference
    )
    assert committed == ends


@on_each_broker()
async def test_a_huge_record_on_one_partition_does_not_hold_up_small_jobs_on_another(
    kafka, causal_model, causal_scorer, causal_reference
) -> None:
    """A 7 MiB text and a 7 MiB, 1,024-item job (each item short enough to be tokenized, so its prepare
    takes seconds) sit on partition 0; small jobs on partition 1 are answered while they are prepared."""
    stream = await mixed_stream(
        kafka, 6, seed=5, model_name=causal_scorer.describe().model_name, prefix="s", partitions=2
    )
    requests = stream.requests
    words = " ".join(["capital", "California", "rivers", "mountains", "fox"] * 1500)  # ~37 KB
    huge_text = _job("huge-text", query="q", items=[(words * 200)[: 7 << 20]])
    chunk = words[:7200]
    many_items = _job("many-items", query=chunk, items=[chunk] * 1024)  # every pair over the limit
    assert len(huge_text) > 7 << 20 and len(many_items) > 7 << 20
    small = [dataclasses.replace(r, partition=1) for r in stream.records]
    warm = Out(requests, _job("warm"), b"warm", partition=1)

    async with InProcessWorker(stream.settings(causal_model), causal_scorer.engine) as worker:
        await produce(kafka.bootstrap, [warm])
        await stream.read_replies(1, timeout_s=30)
        await produce(
            kafka.bootstrap,
            [
                Out(requests, huge_text, b"huge-text", partition=0),
                Out(requests, many_items, b"many", partition=0),
            ],
            max_request_size=16 << 20,
        )
        deadline = time.monotonic() + 30
        while worker.worker.ledger.jobs == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.005)  # the big records have been fetched and are being prepared
        started = time.monotonic()
        await produce(kafka.bootstrap, small)
        got = await read_topic(
            kafka.bootstrap,
            stream.replies,
            lambda rs: {r.key for r in rs} >= {s.key for s in small},
            timeout_s=30,
        )
        small_latency = time.monotonic() - started
        got = await stream.read_replies(len(small) + 3, timeout_s=60)
        assert worker.running
        assert await worker.stop() == 0

    by_key = _keyed(got)
    for key in (b"huge-text", b"many"):
        (result,) = by_key[key]
        assert result.error is not None and result.error.code is ErrorCode.TOO_LONG, result.error
    stamps = {r.key: r.timestamp for r in got}
    assert max(stamps[s.key] for s in small) <= stamps[b"many"], "small jobs waited for the big prepare"
    assert small_latency < 3.0, f"small jobs answered {small_latency:.2f}s after they were produced"
    assert_answers(
        [r for k, rs in by_key.items() if k.startswith(b"key-") for r in rs], stream.sent, causal_reference
    )


@on_each_broker()
async def test_a_record_the_client_cannot_parse_is_answered_and_skipped_not_fatal(
    kafka, causal_model, causal_scorer
) -> None:
    """aiokafka raises UnicodeDecodeError for the whole poll on a non-UTF-8 header name; before, that
    reached the worker's loop and killed it, and a restart read the same record again."""
    stream = await mixed_stream(
        kafka, 6, seed=21, model_name=causal_scorer.describe().model_name, prefix="beside", partitions=2
    )
    # one producer batch [job, job, BAD, job, job]: aiokafka reads a batch from its start, so the two
    # after the unreadable one are unreadable too, each answered on its own poll
    values = [_job(f"raw-{i}").decode() for i in range(5)]
    produce_with_raw_header(kafka.bootstrap, stream.requests, values, bad=[2])
    for record in stream.records:
        record.partition = 1
    async with InProcessWorker(stream.settings(causal_model), causal_scorer.engine) as worker:
        await produce(kafka.bootstrap, stream.records)
        got = await stream.read_replies(5 + len(stream.records), timeout_s=60, settle_s=0.3)
        # The request topic cannot be read back by the test's own aiokafka reader either: the ends are
        # known (5 records on partition 0, the stream's on partition 1).
        ends = {0: 5, 1: len(stream.records)}
        committed = await _committed_when(kafka.bootstrap, stream.group, stream.requests, ends)
        assert worker.running, "an unreadable record must not stop the worker"
        assert await worker.stop() == 0
    by_key = _keyed(got)
    assert by_key[b"raw-0"][0].error is None and by_key[b"raw-1"][0].error is None  # before it: scored
    unreadable = decode_replies(r for r in got if r.key is None)
    assert sorted(r.id for r in unreadable) == [f"{stream.requests}:0:{offset}" for offset in (2, 3, 4)]
    assert all(r.error.code is ErrorCode.INVALID_MESSAGE and "UTF-8" in r.error.message for r in unreadable)
    assert all(by_key[r.key][0].error is None for r in stream.records)  # the other partition: unharmed
    assert committed == ends


async def _committed_when(bootstrap: str, group: str, topic: str, want: dict[int, int]) -> dict:
    deadline = time.monotonic() + 15
    while True:
        committed = await committed_offsets(bootstrap, group, topic, len(want))
        if committed == want or time.monotonic() > deadline:
            return committed
        await asyncio.sleep(0.2)
