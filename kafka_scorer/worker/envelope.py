"""Kafka records in and out: a consumed record becomes a job or a typed rejection; a result becomes a record.

This is the worker's edge (SPEC §2, §3), one `RecordCodec` both ways, as faststream splits its broker
edge into a parser and a decoder: the codec reads the headers the contract names (the parser: job id,
reply topic, content type, trace context, decided once), hands the value to the wire protocol's
decoder in one call (`read_job`, which answers a job or a typed `Undecodable` with the reply's format,
and never calls back), and builds the dead-letter copy of a record that could not be decoded; a result
goes out through the same codec. Calls run one way, edge to protocol. Nothing here touches the network,
so every rule is unit-tested without a broker.

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
    Result,
    Undecodable,
    WireFormat,
    content_type_of,
    declared_format,
    encode_result,
    error_result,
    read_job,
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


@dataclass(frozen=True, slots=True)
class RecordCodec:
    """The worker's edge, both ways: `decode_record` turns a consumed record into a job or a rejection,
    `encode_record` a result into a record. Built once by the worker from its settings and shared by
    intake and delivery."""

    reply_topic: str
    """The default reply topic: a record that names none is answered there, and so is one whose own
    reply topic refuses the answer."""
    dead_letter_topic_for: Callable[[str], str]
    max_message_bytes: int
    model_name: str
    group_id: str = ""
    max_header_bytes: int = 65536

    def decode_record(self, record: RecordLike) -> Inbound | Rejected:
        """Decode one consumed record; never raises for bad input."""
        if isinstance(record, Unreadable):
            return self._unreadable(record)
        headers = list(record.headers or ())
        header_bytes = _headers_size(headers)
        if header_bytes > self.max_header_bytes:
            return self._oversized_headers(record, header_bytes)
        return self._decode_value(_parse(record, headers, self.reply_topic))

    def encode_record(self, result: Result, origin: Origin) -> OutRecord:
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

    def bare_origin(self, record: RecordLike) -> Origin:
        """Where to answer a record whose headers are not used: the default reply topic, in JSON."""
        return _origin(record, self.reply_topic, "json")

    def _decode_value(self, parsed: _Parsed) -> Inbound | Rejected:
        """The decoder's half: a value within `max_message_bytes` goes to the wire protocol's `read_job`,
        once; what it answers is final."""
        value = parsed.record.value
        if value is not None and len(value) > self.max_message_bytes:
            message = f"record value is {len(value)} bytes, over max_message_bytes={self.max_message_bytes}"
            result = error_result(parsed.fallback_id, ErrorCode.TOO_LONG, message, model=self.model_name)
            origin = parsed.origin(declared_format(parsed.content_type))
            return Rejected(result=result, origin=origin, dead_letter=None)
        decoded = read_job(value, parsed.content_type)
        if isinstance(decoded, Undecodable):
            return self._undecodable(parsed, decoded)
        job, fmt = decoded
        return Inbound(job=job, job_id=job.id or parsed.fallback_id, origin=parsed.origin(fmt))

    def _undecodable(self, parsed: _Parsed, failure: Undecodable) -> Rejected:
        """A value that is no job, answered in the format the decoder named; bytes that are no document at
        all are copied to the dead-letter topic as well (Kafka cannot carry a record with neither a key
        nor a value)."""
        record = parsed.record
        job_id = failure.job_id or parsed.fallback_id
        result = error_result(job_id, failure.code, failure.message, model=self.model_name)
        dead = None
        if failure.code is ErrorCode.INVALID_MESSAGE and (record.value is not None or record.key is not None):
            dead = _dead_letter(record, self.dead_letter_topic_for(record.topic), failure, self.group_id)
        return Rejected(result=result, origin=parsed.origin(failure.fmt), dead_letter=dead)

    def _unreadable(self, record: Unreadable) -> Rejected:
        """The answer at a position the Kafka client could not read: nothing to decode or dead-letter."""
        message = f"the Kafka client cannot read the record at this offset: {record.reason}"
        job_id = f"{record.topic}:{record.partition}:{record.offset}"
        result = error_result(job_id, ErrorCode.INVALID_MESSAGE, message, model=self.model_name)
        where = Origin(record.topic, record.partition, record.offset, None, self.reply_topic, "json", None)
        return Rejected(result=result, origin=where, dead_letter=None)

    def _oversized_headers(self, record: RecordLike, size: int) -> Rejected:
        """Answer without reading any header: none of them can be trusted to be small enough to echo."""
        message = (
            f"record headers are {size} bytes, over max_header_bytes={self.max_header_bytes}; "
            "the headers were ignored (no correlation header in this reply)"
        )
        job_id = None
        if record.value is not None and len(record.value) <= self.max_message_bytes:
            decoded = read_job(record.value)
            job_id = decoded.job_id if isinstance(decoded, Undecodable) else decoded[0].id
        fallback_id = job_id or f"{record.topic}:{record.partition}:{record.offset}"
        result = error_result(fallback_id, ErrorCode.INVALID_REQUEST, message, model=self.model_name)
        return Rejected(result=result, origin=self.bare_origin(record), dead_letter=None)


@dataclass(frozen=True, slots=True)
class _Parsed:
    """A record as the parser's half leaves it: the headers the contract names read once, the value not
    yet decoded."""

    record: RecordLike
    content_type: str | None
    reply_topic: str
    correlation: tuple[str, bytes] | None
    notes: tuple[str, ...]
    trace: TraceContext | None

    @property
    def fallback_id(self) -> str:
        """The job id when the job names none: the correlation header, else the record's position."""
        record = self.record
        return _correlation_id(self.correlation) or f"{record.topic}:{record.partition}:{record.offset}"

    def origin(self, fmt: WireFormat) -> Origin:
        return _origin(self.record, self.reply_topic, fmt, self.correlation, self.notes, self.trace)


def _origin(
    record: RecordLike,
    reply_topic: str,
    fmt: WireFormat,
    correlation: tuple[str, bytes] | None = None,
    notes: tuple[str, ...] = (),
    trace: TraceContext | None = None,
) -> Origin:
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


def _parse(record: RecordLike, headers: Sequence[tuple[str, bytes]], default_reply_topic: str) -> _Parsed:
    """The parser's half: correlation, reply topic, content type and trace context from the headers."""
    content_type_header = _header(headers, CONTENT_TYPE_HEADERS)
    reply_topic, notes = _reply_topic(_header(headers, REPLY_TOPIC_HEADERS), default_reply_topic)
    return _Parsed(
        record=record,
        content_type=_text(content_type_header[1]) if content_type_header else None,
        reply_topic=reply_topic,
        correlation=_header(headers, CORRELATION_HEADERS),
        notes=notes,
        trace=trace_context(_value(headers, (TRACEPARENT,)), _value(headers, (TRACESTATE,))),
    )


def _reply_topic(reply: tuple[str, bytes] | None, default: str) -> tuple[str, tuple[str, ...]]:
    """The topic a reply header asks for, if it is a valid topic name; else the default and a note."""
    if reply is None:
        return default, ()
    asked = _text(reply[1])
    if asked and _TOPIC_NAME.fullmatch(asked) and asked not in (".", ".."):
        return asked, ()
    return default, (f"{reply[0]} header {reply[1]!r} is not a valid topic name; answered on {default}",)


def _headers_size(headers: Sequence[tuple[str, bytes | None]]) -> int:
    return sum(len(name.encode("utf-8", "surrogatepass")) + len(value or b"") for name, value in headers)


def _correlation_id(correlation: tuple[str, bytes] | None) -> str | None:
    """The header as text; Spring sends a binary UUID, which becomes hex."""
    if correlation is None or not correlation[1]:
        return None
    return _text(correlation[1]) or correlation[1].hex()


def _dead_letter(record: RecordLike, topic: str, failure: Undecodable, group_id: str = "") -> OutRecord:
    """The record untouched (key, value, headers) plus Spring-style headers saying why and from where."""
    headers: Headers = list(record.headers or ())
    headers += [
        (DLT_EXCEPTION_MESSAGE, failure.message.encode()),
        (DLT_EXCEPTION_CODE, failure.code.value.encode()),
        (DLT_ORIGINAL_TOPIC, record.topic.encode()),
        (DLT_ORIGINAL_PARTITION, struct.pack(">i", record.partition)),
        (DLT_ORIGINAL_OFFSET, struct.pack(">q", record.offset)),
        (DLT_ORIGINAL_TIMESTAMP, struct.pack(">q", record.timestamp if record.timestamp is not None else -1)),
    ]
    if group_id:
        headers.append((DLT_ORIGINAL_GROUP, group_id.encode()))
    return OutRecord(topic=topic, key=record.key, value=record.value, headers=headers)
