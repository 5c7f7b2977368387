"""Trace context for jobs: W3C `traceparent`/`tracestate` in on the job, out on its result; spans when
OpenTelemetry is set up.

Two layers, so that tracing never becomes a dependency:
- Header propagation needs no package. A job's `traceparent` (and `tracestate`) header is parsed and
  validated here (W3C Trace Context); a malformed one is ignored, never an error: a tracing header
  must not cost anyone their score. The result record carries the context on, so whoever reads the
  reply topic continues the same trace.
- Spans need the OpenTelemetry SDK (the `otel` extra) configured with the standard `OTEL_*`
  variables, or a tracer provider that an instrumentation wrapper (`opentelemetry-instrument`)
  installed before the worker started. Each job then gets a `consume` span, child of the incoming
  traceparent, with `prepare` and `produce` under it, and the result carries the `produce` span's
  context. A forward pass serves many jobs, so its `batch` span (with `forward` under it) has no one
  parent: it links to each of its jobs' `consume` spans, as OpenTelemetry's messaging conventions do
  for batch processing.

The OpenTelemetry import is guarded in this module alone; without it `Tracing` and `JobTrace` are
no-ops apart from the header pass-through.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Protocol

from kafka_scorer import __version__

if TYPE_CHECKING:
    from kafka_scorer.wire.protocol import Result

try:
    from opentelemetry import trace as otel
    from opentelemetry.context import Context
except ImportError:  # the `otel` extra is not installed: header pass-through only
    otel = None  # type: ignore[assignment]  # the optional dependency's absence, tested before each use

log = logging.getLogger(__name__)


class Consumed(Protocol):
    """What a job's `consume` span reads of its record (envelope.py's `Origin`, which carries the trace
    context defined here, so this module names the fields instead of importing it)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def trace(self) -> TraceContext | None: ...


TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"

# version-traceid-parentid-flags; a version after 00 may append fields, which are not read (W3C rule)
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[^\x00-\x1f]*)?")
_STATE_KEY = re.compile(r"[a-z][_0-9a-z*/-]{0,255}|[a-z0-9][_0-9a-z*/-]{0,240}@[a-z][_0-9a-z*/-]{0,13}")
_STATE_VALUE = re.compile(r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]")
_MAX_STATE_MEMBERS = 32  # W3C: more means the whole tracestate is discarded
_MAX_STATE_CHARS = 512  # what W3C asks every participant to carry; longer ones are dropped, not cut
_OWS = " \t"
_ERROR_TEXT = 200  # characters of an error message kept in a span's status


@dataclass(frozen=True, slots=True)
class TraceContext:
    """A validated W3C trace context: what the job's producer passed, or the span that continues it."""

    trace_id: str  # 32 lowercase hex digits, not all zero
    parent_id: str  # 16 lowercase hex digits, not all zero
    flags: int
    tracestate: str | None = None

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.parent_id}-{self.flags:02x}"

    def headers(self) -> list[tuple[str, bytes]]:
        out = [(TRACEPARENT, self.traceparent.encode("ascii"))]
        if self.tracestate:
            out.append((TRACESTATE, self.tracestate.encode("ascii")))
        return out


def _ascii(value: bytes | str | None) -> str | None:
    """The header value as text without surrounding blanks; None unless it is all ASCII."""
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    return text.strip(_OWS) if text.isascii() else None


def parse_traceparent(value: bytes | str | None) -> tuple[str, str, int] | None:
    """(trace id, parent id, flags) of a valid `traceparent` value; None for anything else."""
    text = _ascii(value)
    match = _TRACEPARENT.fullmatch(text) if text is not None else None
    if match is None:
        return None
    version, trace_id, parent_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    if trace_id == "0" * 32 or parent_id == "0" * 16:
        return None
    return trace_id, parent_id, int(flags, 16)


def parse_tracestate(value: bytes | str | None) -> str | None:
    """A valid `tracestate` value, its list members re-joined without blanks; None when it is absent,
    empty or invalid anywhere (W3C: an invalid tracestate is discarded whole, not repaired)."""
    text = _ascii(value)
    if not text or len(text) > _MAX_STATE_CHARS:
        return None
    members = [member.strip(_OWS) for member in text.split(",")]
    members = [member for member in members if member]
    keys = set()
    for member in members:
        key, eq, state = member.partition("=")
        if not eq or not _STATE_KEY.fullmatch(key) or not _STATE_VALUE.fullmatch(state) or key in keys:
            return None
        keys.add(key)
    if not members or len(members) > _MAX_STATE_MEMBERS:
        return None
    return ",".join(members)


def trace_context(traceparent: bytes | None, tracestate: bytes | None) -> TraceContext | None:
    """The job's trace context from its two header values; a tracestate counts only beside a valid
    traceparent (W3C: without one it must not be read)."""
    parsed = parse_traceparent(traceparent)
    if parsed is None:
        return None
    return TraceContext(*parsed, tracestate=parse_tracestate(tracestate))


class JobTrace:
    """One job's spans. This base is the no-op used without OpenTelemetry: it carries the job's own
    trace context on to its result and records nothing, so it holds no state and one instance serves
    every job."""

    def span(self, name: str) -> contextlib.AbstractContextManager[object]:
        """A child span of the job's `consume` span, usable on any thread (prepare runs on a pool)."""
        return contextlib.nullcontext()

    def outgoing(self, incoming: TraceContext | None, topic: str) -> TraceContext | None:
        """The trace context the result record carries (starting the `produce` span)."""
        return incoming

    def link(self) -> Any:
        """A span link to the job's `consume` span, for the batch that computed it."""
        return None

    def end(self, result: Result | None) -> None:
        """The job is settled: answered with `result`, or dropped (None) for the partition's next owner."""


NO_SPANS = JobTrace()


class OtelJobTrace(JobTrace):
    """One job's spans through an OpenTelemetry tracer: `consume` from the start, `produce` once its result
    record is built."""

    def __init__(self, tracer: Any, consume: Any) -> None:
        self._tracer = tracer
        self._consume = consume
        self._context = otel.set_span_in_context(consume, Context())
        self._produce: Any = None

    def span(self, name: str) -> contextlib.AbstractContextManager[object]:
        return self._tracer.start_as_current_span(name, context=self._context)

    def outgoing(self, incoming: TraceContext | None, topic: str) -> TraceContext | None:
        if self._produce is None:
            self._produce = self._tracer.start_span(
                "produce",
                context=self._context,
                kind=otel.SpanKind.PRODUCER,
                attributes={"messaging.system": "kafka", "messaging.operation.type": "send"},
            )
        self._produce.set_attribute("messaging.destination.name", topic)  # a fallback topic wins
        return _from_span(self._produce) or incoming

    def link(self) -> Any:
        return otel.Link(self._consume.get_span_context())

    def end(self, result: Result | None) -> None:
        if result is None:
            self._consume.set_attribute("kafka_scorer.dropped", True)
        elif result.error is not None:
            code = result.error.code.value
            self._consume.set_attribute("error.type", code)
            description = f"{code}: {result.error.message[:_ERROR_TEXT]}"
            self._consume.set_status(otel.Status(otel.StatusCode.ERROR, description))
        if self._produce is not None:
            self._produce.end()
        self._consume.end()


class Tracing:
    """The worker's tracer: spans through an OpenTelemetry `tracer`, or none when it is None (no
    OpenTelemetry, or none configured; the headers still pass through). `close` shuts `provider`
    down (flushing its spans) when `from_environment` made one."""

    def __init__(self, tracer: Any = None, provider: Any = None) -> None:
        self._tracer = tracer
        self._provider = provider

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def job(self, origin: Consumed, job_id: str, group_id: str) -> JobTrace:
        """The spans of a record just consumed; its `consume` span starts now."""
        if self._tracer is None:
            return NO_SPANS
        parent = Context()  # no incoming context: the job starts a trace, whatever the thread had
        if origin.trace is not None:
            parent = otel.set_span_in_context(otel.NonRecordingSpan(_span_context(origin.trace)), parent)
        consume = self._tracer.start_span(
            "consume",
            context=parent,
            kind=otel.SpanKind.CONSUMER,
            attributes={
                "messaging.system": "kafka",
                "messaging.operation.type": "process",
                "messaging.destination.name": origin.topic,
                "messaging.destination.partition.id": str(origin.partition),
                "messaging.kafka.offset": origin.offset,
                "messaging.consumer.group.name": group_id,
                "messaging.message.id": job_id,
            },
        )
        return OtelJobTrace(self._tracer, consume)

    def batch(
        self,
        jobs: Sequence[JobTrace],
        *,
        formed_at: float,
        started_at: float,
        done_at: float,
        attributes: Mapping[str, int],
    ) -> None:
        """Record one finished forward pass after the fact (times from `time.monotonic()`): the batch from
        its oldest job joining the queue to the end of the pass, and the pass itself."""
        if self._tracer is None:
            return
        links = [link for job in jobs if (link := job.link()) is not None]
        offset = _clock_offset_ns()
        named = {f"kafka_scorer.batch.{key}": value for key, value in attributes.items()}
        batch = self._tracer.start_span(
            "batch", context=Context(), links=links, attributes=named, start_time=offset + _ns(formed_at)
        )
        forward = self._tracer.start_span(
            "forward", context=otel.set_span_in_context(batch, Context()), start_time=offset + _ns(started_at)
        )
        forward.end(end_time=offset + _ns(done_at))
        batch.end(end_time=offset + _ns(done_at))

    def close(self) -> None:
        """Flush and stop what `from_environment` started."""
        if self._provider is not None:
            self._provider.shutdown()


def _span_context(context: TraceContext) -> Any:
    members = [m.split("=", 1) for m in (context.tracestate or "").split(",") if m]
    state = otel.TraceState([(key, value) for key, value in members])
    return otel.SpanContext(
        trace_id=int(context.trace_id, 16),
        span_id=int(context.parent_id, 16),
        is_remote=True,
        trace_flags=otel.TraceFlags(context.flags),
        trace_state=state,
    )


def _from_span(span: Any) -> TraceContext | None:
    context = span.get_span_context()
    if not context.is_valid:
        return None
    return TraceContext(
        trace_id=f"{context.trace_id:032x}",
        parent_id=f"{context.span_id:016x}",
        flags=int(context.trace_flags),
        tracestate=context.trace_state.to_header() or None,
    )


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def _clock_offset_ns() -> int:
    """Epoch minus monotonic time, in ns: turns the batcher's `time.monotonic()` stamps into the epoch
    times spans carry. The epoch clock is read between two monotonic reads and the tightest of three
    tries is kept, so a thread preempted between reads cannot shift the spans by its wait."""
    best: tuple[int, int] | None = None
    for _ in range(3):
        before = time.monotonic_ns()
        wall = time.time_ns()
        after = time.monotonic_ns()
        if best is None or after - before < best[0]:
            best = (after - before, wall - (before + after) // 2)
    assert best is not None
    return best[1]


# ---- set-up from the standard OTEL_* variables ----------------------------------------------------


def _asks_for_traces(env: Mapping[str, str]) -> str | None:
    """The variable that asks for spans, if any. Tracing is opt-in: the SDK's default exporter (otlp to
    localhost) would otherwise fail on every worker that merely has the package installed."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return None if exporter == "none" else "OTEL_TRACES_EXPORTER"
    for name in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        if env.get(name, "").strip():
            return name
    return None


def from_environment(environ: Mapping[str, str] | None = None) -> Tracing:
    """The tracer the standard variables ask for, else a no-op one; never raises.

    The `OTEL_*` variables belong to OpenTelemetry (its SDK and exporters read most of them
    themselves), so they are read here rather than through the worker's Settings. A tracer provider
    already installed (by `opentelemetry-instrument`, or an embedding application) is used as it is.
    Otherwise spans are recorded only when `OTEL_TRACES_EXPORTER` (not `none`) or an OTLP endpoint is
    set; each exporter named (default `otlp`) is loaded from its package's entry point and fed through
    a batch span processor, so `OTEL_BSP_*`, `OTEL_TRACES_SAMPLER`, `OTEL_SERVICE_NAME` and
    `OTEL_RESOURCE_ATTRIBUTES` apply as usual. A mistake costs spans, not the worker: one WARNING line
    names the variable and the fix.
    """
    env = os.environ if environ is None else environ
    if otel is not None and not isinstance(otel.get_tracer_provider(), otel.ProxyTracerProvider):
        return Tracing(otel.get_tracer(__name__, __version__))
    asked = _asks_for_traces(env)
    if asked is None:
        return Tracing()
    provider = _sdk_provider(asked, env.get("OTEL_TRACES_EXPORTER", "").strip().lower() or "otlp")
    if provider is None:
        return Tracing()
    return Tracing(provider.get_tracer(__name__, __version__), provider)


def _sdk_provider(asked: str, exporter_names: str) -> Any:
    """An SDK tracer provider feeding the named exporters; None (after one WARNING) when it cannot be."""
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning(
            "%s is set but the OpenTelemetry SDK is not installed: no spans "
            "(pip install 'kafka-scorer[otel]')",
            asked,
        )
        return None
    exporters = _exporters(exporter_names)
    if not exporters:
        return None
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "kafka-scorer"}))
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    for exporter in exporters.values():
        provider.add_span_processor(BatchSpanProcessor(exporter))
    log.info("tracing: OpenTelemetry spans to %s", ",".join(exporters))
    return provider


def _exporters(names: str) -> dict[str, Any]:
    """The span exporters `OTEL_TRACES_EXPORTER` names, from the `opentelemetry_traces_exporter` entry
    points that exporter packages register; one WARNING line per name that cannot be made."""
    available = {ep.name: ep for ep in entry_points(group="opentelemetry_traces_exporter")}
    made = {}
    for name in [n.strip() for n in names.split(",") if n.strip() not in ("", "none")]:
        if name not in available:
            package = "opentelemetry-exporter-otlp" if name.startswith("otlp") else f"the exporter {name!r}"
            log.warning(
                "OTEL_TRACES_EXPORTER=%s: no span exporter of that name is installed (pip install %s; "
                "installed: %s); no spans to it",
                name,
                package,
                ",".join(sorted(available)) or "none",
            )
            continue
        try:
            made[name] = available[name].load()()
        except Exception as exc:
            log.warning("OTEL_TRACES_EXPORTER=%s: the exporter failed (%r); no spans to it", name, exc)
    return made
