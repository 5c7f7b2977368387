"""Trace context through a real broker: a job's traceparent reaches its result, and with the
OpenTelemetry SDK (in-memory exporter) the worker records consume, prepare, batch, forward and produce
with the right parents; dead letters and error results leave one log line each."""

from __future__ import annotations

import logging

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kafka_scorer.wire.protocol import ErrorCode, Job, encode_job
from kafka_scorer.worker.logs import one_line
from kafka_scorer.worker.tracing import Tracing, parse_traceparent
from tests.integration.kafka_helpers import InProcessWorker, Out, decode_replies, fresh_topics, produce

pytestmark = pytest.mark.integration

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


async def test_a_jobs_trace_reaches_its_result_through_the_workers_spans(
    kafka, causal_model, causal_scorer, caplog: pytest.LogCaptureFixture
) -> None:
    topics = await fresh_topics(kafka, partitions=1, dead_letters=True)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    def job(job_id: str, headers: list[tuple[str, bytes]]) -> Out:
        body = Job(id=job_id, query=[5, 17, 42], items=[[7, 8], [9]], label_token_ids=[1, 2])
        return Out(topics.requests, encode_job(body), key=job_id.encode(), headers=headers)

    records = [
        job("traced", [("traceparent", TRACEPARENT.encode()), ("tracestate", b"vendor=opaque")]),
        job("malformed", [("traceparent", f"00-{TRACE_ID.upper()}-{PARENT_ID}-01".encode())]),
        job("untraced", []),
        Out(topics.requests, b"\x00 not a job", key=b"bad", headers=[("traceparent", TRACEPARENT.encode())]),
    ]
    worker = InProcessWorker(
        topics.settings(causal_model), causal_scorer.engine, Tracing(provider.get_tracer("test"))
    )
    with caplog.at_level(logging.INFO, logger="kafka_scorer.worker"):
        async with worker:
            await produce(kafka.bootstrap, records)
            replies = await topics.read_replies(len(records), timeout_s=60)
            assert await worker.stop() == 0
    results = {
        result.id: (result, dict(record.headers))
        for record, result in zip(replies, decode_replies(replies), strict=True)
    }
    assert len(results) == len(records)

    # the batch histograms count per forward pass: three jobs of two items each went through the model
    metrics = worker.worker.metrics.render().decode()
    assert "kafka_scorer_batch_jobs_sum 3.0" in metrics and "kafka_scorer_batch_items_sum 6.0" in metrics
    assert 'kafka_scorer_errors_total{code="invalid_message"} 1.0' in metrics

    spans = exporter.get_finished_spans()
    consumes = {span.attributes["messaging.message.id"]: span for span in spans if span.name == "consume"}
    assert set(consumes) == set(results)

    # the traced job: its consume span continues the producer's trace, and the result continues it again
    consume = consumes["traced"]
    assert consume.context.trace_id == int(TRACE_ID, 16) and consume.parent.span_id == int(PARENT_ID, 16)
    (result, headers) = results["traced"]
    assert result.error is None and result.scores is not None
    trace_id, parent_id, _ = parse_traceparent(headers["traceparent"])
    assert trace_id == TRACE_ID
    assert headers["tracestate"] == b"vendor=opaque"
    (produce_span,) = [
        s for s in spans if s.name == "produce" and s.parent.span_id == consume.context.span_id
    ]
    assert parent_id == f"{produce_span.context.span_id:016x}"
    assert produce_span.attributes["messaging.destination.name"] == topics.replies
    (prepare,) = [s for s in spans if s.name == "prepare" and s.parent.span_id == consume.context.span_id]
    batches = [s for s in spans if s.name == "batch"]
    (batch,) = [b for b in batches if consume.context.span_id in {link.context.span_id for link in b.links}]
    assert batch.parent is None and batch.attributes["kafka_scorer.batch.items"] >= 2
    (forward,) = [s for s in spans if s.name == "forward" and s.parent.span_id == batch.context.span_id]
    assert prepare.end_time <= forward.start_time <= forward.end_time <= produce_span.start_time

    # a malformed traceparent is ignored, not an error: the job is scored and starts a trace of its own
    malformed, malformed_headers = results["malformed"]
    assert malformed.error is None
    assert consumes["malformed"].parent is None
    assert (
        parse_traceparent(malformed_headers["traceparent"])[0]
        == f"{consumes['malformed'].context.trace_id:032x}"
    )

    # the undecodable record: answered (with its trace), dead-lettered, one line for each
    (bad_id,) = [job_id for job_id, (r, _) in results.items() if r.error is not None]
    bad, bad_headers = results[bad_id]
    assert bad.error.code is ErrorCode.INVALID_MESSAGE
    assert parse_traceparent(bad_headers["traceparent"])[0] == TRACE_ID
    assert consumes[bad_id].status.status_code.name == "ERROR"
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    why = one_line(bad.error.message)
    dead = [(level, m) for level, m in lines if m.startswith("dead-lettered")]
    assert dead == [
        (
            logging.WARNING,
            f"dead-lettered {topics.requests}:0@3 to {topics.dead_letters} (job {bad_id}): {why}",
        )
    ]
    errors = [(level, m) for level, m in lines if m.startswith("error result")]
    assert errors == [
        (logging.INFO, f"error result for job {bad_id} ({topics.requests}[0]@3): invalid_message: {why}")
    ]
