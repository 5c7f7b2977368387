"""Trace context: W3C headers parsed strictly, carried from the job to its result, never an error; spans
through the OpenTelemetry SDK's in-memory exporter; and the worker without any OpenTelemetry package.

The worker's whole path with spans runs against the real broker in
tests/integration/test_trace_propagation.py.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys

import pytest
from aiokafka.errors import TopicAuthorizationFailedError
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kafka_scorer.wire.protocol import ErrorCode, Job, encode_job, error_result
from kafka_scorer.worker.envelope import Inbound
from kafka_scorer.worker.tracing import (
    TraceContext,
    Tracing,
    from_environment,
    parse_traceparent,
    parse_tracestate,
    trace_context,
)
from tests.worker.conftest import Rec
from tests.worker.test_delivery import DEFAULT, Harness
from tests.worker.test_envelope import CODEC

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"  # W3C Trace Context's own example
STRICT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
JOB = encode_job(Job(id="j1", query="q", items=["a"], label_token_ids=[1]))


def _headers_of(record) -> dict[str, bytes]:
    return dict(record.headers)


# ---- parsing --------------------------------------------------------------------------------------


def test_valid_traceparents_parse() -> None:
    assert parse_traceparent(TRACEPARENT.encode()) == (TRACE_ID, PARENT_ID, 1)
    assert parse_traceparent(f" {TRACEPARENT}\t") == (TRACE_ID, PARENT_ID, 1)  # HTTP's optional blanks
    # a later version may append fields; the four known ones are read and re-emitted as version 00
    assert parse_traceparent(f"cc-{TRACE_ID}-{PARENT_ID}-00-what-the-future-holds") == (
        TRACE_ID,
        PARENT_ID,
        0,
    )


@pytest.mark.parametrize(
    "value",
    [
        f"00-{TRACE_ID.upper()}-{PARENT_ID}-01",  # uppercase hex
        f"00-{'0' * 32}-{PARENT_ID}-01",  # all-zero trace id
        f"00-{TRACE_ID}-{'0' * 16}-01",  # all-zero parent id
        f"ff-{TRACE_ID}-{PARENT_ID}-01",  # the forbidden version
        f"00-{TRACE_ID}-{PARENT_ID}-01-extra",  # version 00 has exactly four fields
        f"cc-{TRACE_ID}-{PARENT_ID}-01extra",  # a later version's extra field must follow a dash
        f"00-{TRACE_ID[:-1]}-{PARENT_ID}-01",
        f"00_{TRACE_ID}_{PARENT_ID}_01",
        "",
        None,
        b"\xff\xfe",
        f"00-{TRACE_ID}-{PARENT_ID}-01".encode("utf-16"),
    ],
)
def test_malformed_traceparents_are_ignored(value) -> None:
    assert parse_traceparent(value) is None


_HEX = "0123456789abcdef"


@st.composite
def mutated_traceparents(draw: st.DrawFn) -> str:
    """A valid traceparent with one random edit: most edits break it, the few that do not must still
    parse to a strictly valid value."""
    trace_id = draw(st.text(_HEX, min_size=32, max_size=32))
    parent_id = draw(st.text(_HEX, min_size=16, max_size=16))
    text = f"00-{trace_id}-{parent_id}-01"
    at = draw(st.integers(0, len(text)))
    edit = draw(st.sampled_from(["insert", "delete", "replace"]))
    char = draw(st.characters())
    if edit == "insert":
        return text[:at] + char + text[at:]
    if edit == "delete":
        return text[:at] + text[at + 1 :]
    return text[:at] + char + text[at + 1 :]


@given(st.one_of(st.binary(max_size=80), st.text(max_size=80), mutated_traceparents()))
def test_any_traceparent_value_parses_to_nothing_or_to_a_strict_context(value: bytes | str) -> None:
    parsed = parse_traceparent(value)
    if parsed is not None:
        trace_id, parent_id, flags = parsed
        context = TraceContext(trace_id, parent_id, flags)
        assert STRICT.fullmatch(context.traceparent)
        assert trace_id != "0" * 32 and parent_id != "0" * 16
        assert trace_id in (value if isinstance(value, str) else value.decode("ascii"))


@given(st.one_of(st.binary(max_size=600), st.text(max_size=600)))
def test_any_tracestate_value_is_dropped_or_kept_valid(value: bytes | str) -> None:
    kept = parse_tracestate(value)
    if kept is not None:
        assert parse_tracestate(kept) == kept  # what is kept is itself valid, and stable
        assert len(kept) <= 512 and kept.isascii() and "\n" not in kept


def test_tracestate_rules() -> None:
    assert (
        parse_tracestate(b"rojo=00f067aa0ba902b7, congo=t61rcWkgMzE")
        == "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
    )
    assert parse_tracestate("tenant@vendor=x,,a=1") == "tenant@vendor=x,a=1"  # empty members are skipped
    assert parse_tracestate("a=1,a=2") is None  # a key twice
    assert parse_tracestate("Upper=1") is None  # keys are lowercase
    assert parse_tracestate("a=1=2") is None  # `=` is not allowed in a value
    assert parse_tracestate(",".join(f"k{i}=v" for i in range(33))) is None  # over 32 members
    assert parse_tracestate(",".join(f"k{i}=v" for i in range(32))) is not None
    assert parse_tracestate("a=" + "x" * 600) is None  # over 512 characters: dropped, not cut
    assert parse_tracestate("") is None and parse_tracestate(None) is None
    # a tracestate counts only beside a valid traceparent
    assert trace_context(b"garbage", b"a=1") is None
    assert trace_context(TRACEPARENT.encode(), b"a=1,bad key=2") == TraceContext(TRACE_ID, PARENT_ID, 1, None)


# ---- from the job's record to its result's record -------------------------------------------------


def test_the_result_record_carries_the_jobs_trace_context() -> None:
    inbound = CODEC.decode_record(Rec(JOB, [("traceparent", TRACEPARENT.encode()), ("tracestate", b"a=1")]))
    assert isinstance(inbound, Inbound)
    assert inbound.origin.trace == TraceContext(TRACE_ID, PARENT_ID, 1, "a=1")
    headers = _headers_of(CODEC.encode_record(error_result("j1", ErrorCode.INTERNAL, "x"), inbound.origin))
    assert headers["traceparent"] == TRACEPARENT.encode() and headers["tracestate"] == b"a=1"


@given(st.binary(max_size=100), st.binary(max_size=100))
def test_a_malformed_trace_header_never_turns_a_job_into_an_error(
    traceparent: bytes, tracestate: bytes
) -> None:
    """Whatever the trace headers hold, the job is still read as a job, and the result's trace headers
    are either absent or strictly valid (nothing malformed is echoed)."""
    decoded = CODEC.decode_record(Rec(JOB, [("traceparent", traceparent), ("tracestate", tracestate)]))
    assert isinstance(decoded, Inbound) and decoded.job_id == "j1"
    headers = _headers_of(CODEC.encode_record(error_result("j1", ErrorCode.INTERNAL, "x"), decoded.origin))
    if "traceparent" in headers:
        assert STRICT.fullmatch(headers["traceparent"].decode())
        assert headers["traceparent"].decode()[3:35] in traceparent.decode("ascii")
    else:
        assert "tracestate" not in headers


async def test_a_result_answered_on_the_fallback_topic_keeps_the_trace_context() -> None:
    h = Harness({"denied": TopicAuthorizationFailedError("denied")})
    answer = h.answer(0, reply_topic="denied")
    answer.origin = _with_trace(answer.origin)
    await h.delivery.deliver([answer])
    (record,) = [r for r in h.producer.sent if r.topic == DEFAULT]
    assert _headers_of(record)["traceparent"] == TRACEPARENT.encode()


def _with_trace(origin):
    from dataclasses import replace

    return replace(origin, trace=TraceContext(TRACE_ID, PARENT_ID, 1))


# ---- log lines ------------------------------------------------------------------------------------


async def test_a_dead_letter_is_one_warning_line_naming_the_record_and_the_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = Harness({})
    answer = h.answer(3, dead_letter="requests.DLT")
    answer.result = error_result("j3", ErrorCode.INVALID_MESSAGE, "not JSON:\nline two")
    with caplog.at_level(logging.INFO, logger="kafka_scorer.worker.delivery"):
        await h.delivery.deliver([answer])
    (line,) = [r for r in caplog.records if "dead-lettered" in r.getMessage()]
    assert line.levelno == logging.WARNING
    assert line.getMessage() == "dead-lettered requests:0@3 to requests.DLT (job j3): not JSON: line two"


@pytest.mark.parametrize(
    ("code", "level"),
    [
        (ErrorCode.INVALID_REQUEST, logging.INFO),
        (ErrorCode.TOO_LONG, logging.INFO),
        (ErrorCode.INTERNAL, logging.WARNING),
    ],
)
def test_an_error_result_is_one_line_at_the_level_its_cause_deserves(
    code: ErrorCode, level: int, caplog: pytest.LogCaptureFixture
) -> None:
    from kafka_scorer.worker.ledger import _log_error_result

    h = Harness({})
    ticket = h.answer(5)
    with caplog.at_level(logging.DEBUG, logger="kafka_scorer.worker.ledger"):
        _log_error_result(ticket, error_result("j5", code, "why " * 200))
    (line,) = caplog.records
    assert line.levelno == level
    message = line.getMessage()
    assert message.startswith(f"error result for job j5 (requests[0]@5): {code.value}: why why")
    assert len(message) < 400 and "\n" not in message


# ---- spans ----------------------------------------------------------------------------------------


def _memory_tracing() -> tuple[Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider.get_tracer("test")), exporter


def test_spans_of_two_jobs_sharing_a_batch() -> None:
    """consume is the child of the job's traceparent, prepare and produce its children; the shared batch
    links to both jobs, forward is the batch's child; the result carries the produce span's context."""
    tracing, exporter = _memory_tracing()
    origins = []
    for offset, headers in ((1, [("traceparent", TRACEPARENT.encode())]), (2, [])):
        decoded = CODEC.decode_record(Rec(JOB, headers, offset=offset))
        assert isinstance(decoded, Inbound)
        origins.append(decoded.origin)
    jobs = [tracing.job(origin, "j1", "group") for origin in origins]
    for job in jobs:
        with job.span("prepare"):
            pass
    tracing.batch(
        jobs, formed_at=0.0, started_at=0.0, done_at=0.01, attributes={"jobs": 2, "items": 2, "tokens": 9}
    )
    outgoing = jobs[0].outgoing(origins[0].trace, "results")
    for job, code in zip(jobs, (ErrorCode.INTERNAL, None), strict=True):
        job.end(error_result("j1", code, "boom") if code else None)
    spans = {(s.name, s.attributes.get("messaging.kafka.offset")): s for s in exporter.get_finished_spans()}
    consume = spans[("consume", 1)]
    assert consume.parent.span_id == int(PARENT_ID, 16) and consume.context.trace_id == int(TRACE_ID, 16)
    assert spans[("consume", 2)].parent is None  # no traceparent: the job starts a trace
    assert (
        spans[("consume", 2)].status.status_code.name == "UNSET"
        and spans[("consume", 2)].attributes["kafka_scorer.dropped"]
    )
    prepares = [s for s in exporter.get_finished_spans() if s.name == "prepare"]
    assert {s.parent.span_id for s in prepares} == {spans[("consume", o)].context.span_id for o in (1, 2)}
    (produce,) = [s for s in exporter.get_finished_spans() if s.name == "produce"]
    assert produce.parent.span_id == consume.context.span_id
    assert outgoing == TraceContext(TRACE_ID, f"{produce.context.span_id:016x}", 1)
    (batch,) = [s for s in exporter.get_finished_spans() if s.name == "batch"]
    assert batch.parent is None and batch.attributes["kafka_scorer.batch.tokens"] == 9
    assert {link.context.span_id for link in batch.links} == {
        spans[("consume", o)].context.span_id for o in (1, 2)
    }
    (forward,) = [s for s in exporter.get_finished_spans() if s.name == "forward"]
    assert forward.parent.span_id == batch.context.span_id
    assert consume.status.status_code.name == "ERROR" and consume.attributes["error.type"] == "internal"


def test_from_environment(caplog: pytest.LogCaptureFixture) -> None:
    """Spans only when asked for; an exporter that is not installed is one warning naming the variable."""
    assert not from_environment({}).enabled
    assert not from_environment({"OTEL_TRACES_EXPORTER": "none"}).enabled
    assert not from_environment({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}).enabled
    console = from_environment({"OTEL_TRACES_EXPORTER": "console"})
    assert console.enabled
    console.close()
    with caplog.at_level(logging.WARNING, logger="kafka_scorer.worker.tracing"):
        assert not from_environment({"OTEL_TRACES_EXPORTER": "nosuch"}).enabled
    (line,) = caplog.records
    assert "OTEL_TRACES_EXPORTER=nosuch" in line.getMessage() and "console" in line.getMessage()


_WITHOUT_OTEL = """
import dataclasses, logging, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError("blocked for this test")
sys.meta_path.insert(0, Block())
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
import kafka_scorer.worker.service
from kafka_scorer.worker import tracing
from kafka_scorer.worker.envelope import RecordCodec
from kafka_scorer.wire.protocol import Job, encode_job, error_result, ErrorCode
assert tracing.otel is None
t = tracing.from_environment({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"})
assert not t.enabled
class Rec:
    topic, partition, offset, timestamp, key = "jobs", 0, 1, 0, None
    value = encode_job(Job(id="j", query="q", items=[], label_token_ids=[1]))
    headers = [("traceparent", sys.argv[1].encode())]
codec = RecordCodec("results", lambda t: t + ".DLT", 10000, "m")
origin = codec.decode_record(Rec()).origin
job = t.job(origin, "j", "g")
with job.span("prepare"):
    pass
origin = dataclasses.replace(origin, trace=job.outgoing(origin.trace, "r"))
job.end(None)
out = codec.encode_record(error_result("j", ErrorCode.INTERNAL, "x"), origin)
print(dict(out.headers)["traceparent"].decode())
"""


def test_without_opentelemetry_headers_still_pass_through() -> None:
    """No OpenTelemetry package at all: the worker imports, the job's traceparent reaches the result
    unchanged, and an OTLP endpoint set in the environment is one warning, not a crash."""
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_OTEL, TRACEPARENT], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == TRACEPARENT
    assert "OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry SDK is not installed" in done.stderr


_UNDER_INSTRUMENTATION = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from kafka_scorer.worker.tracing import from_environment
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)  # what opentelemetry-instrument does before the worker starts
tracing = from_environment({})
tracing.batch([], formed_at=0.0, started_at=0.0, done_at=0.0, attributes={})
tracing.close()  # not ours to shut down: the wrapper's provider keeps working
tracing.batch([], formed_at=0.0, started_at=0.0, done_at=0.0, attributes={})
print(sorted(span.name for span in exporter.get_finished_spans()))
"""


def test_a_tracer_provider_installed_before_the_worker_is_used_as_it_is() -> None:
    """Under `opentelemetry-instrument` (or an embedding application) the global provider is already
    set: the worker records through it with no OTEL_* variable of its own, and leaves it running."""
    done = subprocess.run(
        [sys.executable, "-c", _UNDER_INSTRUMENTATION], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(["batch", "batch", "forward", "forward"])
