"""Kafka records in and out: a consumed record becomes a job or a typed rejection; a result becomes a record.

This is the worker's edge (SPEC §2, §3): it reads the headers the contract names, decides the job id,
the reply topic and the reply format once, and builds the dead-letter copy of a record that could not
be decoded. Nothing here touches the network, so every rule is unit-tested without a broker.

Choices where SPEC is silent (also in docs/worker.md):
- A record larger than `max_message_bytes` gets a `too_long` result without being decoded and is not
  dead-lettered (a copy would hit the same size limits on the way out); the original stays in its topic.
- A record that cannot be decoded is answered in the format its `content-type` header names, else JSON.
- A record whose headers total more than `max_header_bytes` gets `invalid_request` and its headers are
  not read at all: the reply goes to the default reply topic, in JSON, without a correlation header
  (echoing a megabyte-sized one could make the reply itself unproducible); its id is the body's `id`
  when the body decodes that far, else `topic:partition:offset`.
- A header named twice: the first one counts (exact spelling before case-insensitive matches).
- Header values that are not UTF-8: a binary correlation id becomes hex; a reply topic or content
  type that is not text is ignored (the first with a warning in the result).
- A `traceparent` that is not valid W3C Trace Context is ignored (so is its `tracestate`); a valid one
  goes on to the result record (tracing.py).
- Dead-letter headers use Spring Kafka's names and encodings (partition: 4-byte big-endian int, offset
  and timestamp: 8-byte big-endian), so Spring's tooling reads them.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec

from kafka_scorer.kafka.records import Headers, OutRecord, RecordLike, Unreadable
from kafka_scorer.wire.protocol import (
    ErrorCode,
    Job,
    MessageDecodeError,
    Result,
    WireFormat,
    content_type_of,
    decode_job,
    encode_result,
    error_result,
    sniff_format,
)
from kafka_scorer.worker.tracing import TRACEPARENT, TRACESTATE, TraceContext, trace_context

CORRELATION_HEADERS = ("correlation_id", "kafka_correlationId")
REPLY_TOPIC_HEADERS = ("reply_topic", "kafka_replyTopic")
CONTENT_TYPE_HEADERS = ("content-type", "contentType")

_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")

DLT_EXCEPTION_MESSAGE = "kafka_dlt-exception-message"
DLT_EXCEPTION_CODE = "kafka_dlt-exception-code"
DLT_ORIGINAL_TOPIC = "kafka_dlt-original-topic"
DLT_ORIGINAL_PARTITION = "kafka_dlt-original-partition"
DLT_ORIGINAL_OFFSET = "kafka_dlt-original-offset"
DLT_ORIGINAL_TIMESTAMP = "kafka_dlt-original-timestamp"
DLT_ORIGINAL_GROUP = "kafka_dlt-original-consumer-group"


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a job came from and everything needed to answer it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    reply_topic: str
    fmt: WireFormat
    correlation: tuple[str, bytes] | None  # header name as it arrived, raw value
    notes: tuple[str, ...] = ()  # warnings about the record itself, added to the result's `warnings`
    trace: TraceContext | None = None  # the job's valid W3C trace context, carried on to the result


@dataclass(frozen=True, slots=True)
class Inbound:
    """A decoded job, ready for the engine."""

    job: Job
    job_id: str
    origin: Origin


@dataclass(frozen=True, slots=True)
class Rejected:
    """A record answered with an error without reaching the engine; maybe with a dead-letter copy."""

    result: Result
    origin: Origin
    dead_letter: OutRecord | None


@dataclass(frozen=True, slots=True)
class WireRules:
    """The settings the edge needs, captured once."""

    reply_topic: str
    dead_letter_topic_for: Callable[[str], str]
    max_message_bytes: int
    model_name: str
    group_id: str = ""
    max_header_bytes: int = 65536


def _header(headers: Sequence[tuple[str, bytes]], names: tuple[str, ...]) -> tuple[str, bytes] | None:
    """The first header with one of `names` (exact spelling first, then case-insensitive)."""
    for name, value in headers:
        if name in names:
            return name, value
    lowered = {n.lower() for n in names}
    for name, value in headers:
        if name.lower() in lowered:
            return name, value
    return None


def _value(headers: Sequence[tuple[str, bytes]], names: tuple[str, ...]) -> bytes | None:
    found = _header(headers, names)
    return found[1] if found is not None else None


def _text(value: bytes | None) -> str | None:
    if value is None:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return None


def read_record(record: RecordLike, rules: WireRules) -> Inbound | Rejected:
    """Decode one consumed record; never raises for bad input."""
    if isinstance(record, Unreadable):
        return _unreadable(record, rules)
    headers = list(record.headers or ())
    header_bytes = _headers_size(headers)
    if header_bytes > rules.max_header_bytes:
        return _oversized_headers(record, rules, header_bytes)
    correlation = _header(headers, CORRELATION_HEADERS)
    reply = _header(headers, REPLY_TOPIC_HEADERS)
    content_type_header = _header(headers, CONTENT_TYPE_HEADERS)
    content_type = _text(content_type_header[1]) if content_type_header else None
    reply_topic = rules.reply_topic
    notes: tuple[str, ...] = ()
    if reply is not None:
        asked = _text(reply[1])
        if asked and _TOPIC_NAME.fullmatch(asked) and asked not in (".", ".."):
            reply_topic = asked
        else:
            notes = (f"{reply[0]} header {reply[1]!r} is not a valid topic name; answered on {reply_topic}",)
    fallback_id = _correlation_id(correlation) or f"{record.topic}:{record.partition}:{record.offset}"
    trace = trace_context(_value(headers, (TRACEPARENT,)), _value(headers, (TRACESTATE,)))

    def origin(fmt: WireFormat) -> Origin:
        return Origin(
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            key=record.key,
            reply_topic=reply_topic,
            fmt=fmt,
            correlation=correlation,
            notes=notes,
            trace=trace,
        )

    value = record.value
    undecoded_fmt: WireFormat = sniff_format(b"", content_type) if content_type else "json"
    if value is not None and len(value) > rules.max_message_bytes:
        message = f"record value is {len(value)} bytes, over max_message_bytes={rules.max_message_bytes}"
        result = error_result(fallback_id, ErrorCode.TOO_LONG, message, model=rules.model_name)
        return Rejected(result=result, origin=origin(undecoded_fmt), dead_letter=None)
    try:
        job, fmt = decode_job(value, content_type)
    except MessageDecodeError as exc:
        if exc.code is ErrorCode.INVALID_MESSAGE:
            result = error_result(fallback_id, exc.code, str(exc), model=rules.model_name)
            dead = None
            if value is not None or record.key is not None:  # Kafka cannot carry a record with neither
                dead = dead_letter_record(
                    record, rules.dead_letter_topic_for(record.topic), exc, rules.group_id
                )
            return Rejected(result=result, origin=origin(undecoded_fmt), dead_letter=dead)
        fmt = sniff_format(value or b"", content_type)
        result = error_result(exc.job_id or fallback_id, exc.code, str(exc), model=rules.model_name)
        return Rejected(result=result, origin=origin(fmt), dead_letter=None)
    return Inbound(job=job, job_id=job.id or fallback_id, origin=origin(fmt))


def _unreadable(record: Unreadable, rules: WireRules) -> Rejected:
    """The answer at a position the Kafka client could not read: nothing to decode or dead-letter."""
    message = f"the Kafka client cannot read the record at this offset: {record.reason}"
    job_id = f"{record.topic}:{record.partition}:{record.offset}"
    result = error_result(job_id, ErrorCode.INVALID_MESSAGE, message, model=rules.model_name)
    where = Origin(record.topic, record.partition, record.offset, None, rules.reply_topic, "json", None)
    return Rejected(result=result, origin=where, dead_letter=None)


def _headers_size(headers: Sequence[tuple[str, bytes | None]]) -> int:
    return sum(len(name.encode("utf-8", "surrogatepass")) + len(value or b"") for name, value in headers)


def _oversized_headers(record: RecordLike, rules: WireRules, size: int) -> Rejected:
    """Answer without reading any header: none of them can be trusted to be small enough to echo."""
    message = (
        f"record headers are {size} bytes, over max_header_bytes={rules.max_header_bytes}; "
        "the headers were ignored (no correlation header in this reply)"
    )
    job_id = None
    if record.value is not None and len(record.value) <= rules.max_message_bytes:
        try:
            job, _ = decode_job(record.value)
            job_id = job.id
        except MessageDecodeError as exc:
            job_id = exc.job_id
    fallback_id = job_id or f"{record.topic}:{record.partition}:{record.offset}"
    result = error_result(fallback_id, ErrorCode.INVALID_REQUEST, message, model=rules.model_name)
    return Rejected(result=result, origin=bare_origin(record, rules), dead_letter=None)


def bare_origin(record: RecordLike, rules: WireRules) -> Origin:
    """Where to answer a record whose headers are not used: the default reply topic, in JSON."""
    return Origin(
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        key=record.key,
        reply_topic=rules.reply_topic,
        fmt="json",
        correlation=None,
    )


def _correlation_id(correlation: tuple[str, bytes] | None) -> str | None:
    """The header as text; Spring sends a binary UUID, which becomes hex."""
    if correlation is None or not correlation[1]:
        return None
    return _text(correlation[1]) or correlation[1].hex()


def dead_letter_record(record: RecordLike, topic: str, exc: Exception, group_id: str = "") -> OutRecord:
    """The record untouched (key, value, headers) plus Spring-style headers saying why and from where."""
    headers: Headers = list(record.headers or ())
    headers += [
        (DLT_EXCEPTION_MESSAGE, str(exc).encode()),
        (DLT_EXCEPTION_CODE, getattr(exc, "code", ErrorCode.INVALID_MESSAGE).value.encode()),
        (DLT_ORIGINAL_TOPIC, record.topic.encode()),
        (DLT_ORIGINAL_PARTITION, struct.pack(">i", record.partition)),
        (DLT_ORIGINAL_OFFSET, struct.pack(">q", record.offset)),
        (DLT_ORIGINAL_TIMESTAMP, struct.pack(">q", record.timestamp if record.timestamp is not None else -1)),
    ]
    if group_id:
        headers.append((DLT_ORIGINAL_GROUP, group_id.encode()))
    return OutRecord(topic=topic, key=record.key, value=record.value, headers=headers)


def result_record(result: Result, origin: Origin) -> OutRecord:
    """The reply: request's key, correlation header echoed under its own name, request's format."""
    if origin.notes:
        result = msgspec.structs.replace(result, warnings=[*result.warnings, *origin.notes])
    headers: Headers = [("content-type", content_type_of(origin.fmt).encode())]
    if origin.correlation is not None:
        headers.append(origin.correlation)
    if origin.trace is not None:
        headers += origin.trace.headers()
    return OutRecord(
        topic=origin.reply_topic,
        key=origin.key,
        value=encode_result(result, origin.fmt),
        headers=headers,
        result=True,
    )
