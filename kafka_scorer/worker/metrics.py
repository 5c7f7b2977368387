"""Prometheus metrics plus `/healthz` and `/readyz`, served on one port from the event loop.

`/healthz` is green from process start (before the model loads and the broker answers) and red once
the worker can no longer score (a fatal device or delivery error; it is on its way out and, should the
exit hang, the orchestrator restarts it); `/readyz` is red, with its reason as the body, until the
worker consumes, and while draining (`Readiness`).

prometheus_client's own server serves metrics only and runs on a thread; probes need a second answer
per path and should reflect the event loop itself (a loop that stops answering is not healthy), so a
tiny asyncio HTTP server serves all three. Each `WorkerMetrics` has its own registry, which keeps
several in-process workers (tests) from colliding.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    generate_latest,
)

from kafka_scorer.worker.cache_metrics import ENGINE_SERIES, Counted

log = logging.getLogger(__name__)

_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_AGE = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


@dataclass(frozen=True)
class _Named:
    """Makes metrics named `kafka_scorer_<name>` in one registry."""

    registry: CollectorRegistry

    def counter(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
        return Counter(f"kafka_scorer_{name}", doc, labels, registry=self.registry)

    def histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        return Histogram(f"kafka_scorer_{name}", doc, buckets=buckets, registry=self.registry)

    def gauge(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
        return Gauge(f"kafka_scorer_{name}", doc, labels, registry=self.registry)


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        named = _Named(self.registry)
        self._counters(named)
        self._histograms(named)
        self._gauges(named)
        self.info = Info("kafka_scorer", "What this worker serves and how", registry=self.registry)

    def _counters(self, named: _Named) -> None:
        counter = named.counter
        self.jobs = counter("jobs", "Jobs answered (error results included)")
        self.items = counter("items", "Items scored")
        self.tokens = counter("tokens", "Tokens run through the model")
        self.cached_tokens = counter("cached_tokens", "Prompt tokens served from the prefix cache, not run")
        self.errors = counter("errors", "Error results by code", ("code",))
        self.dead_letters = counter("dead_letters", "Records copied to a dead-letter topic")
        self.expired = counter(
            "expired", "Jobs answered deadline_exceeded, uncomputed, by priority", ("priority",)
        )
        self.dropped = counter("dropped", "Jobs left for the partition's next owner (revoke, rewind)")
        self.batches = counter("batches", "Forward passes")
        self.pauses = counter("backpressure_pauses", "Times fetching was paused by backpressure")
        self.commit_failures = counter("commit_failures", "Failed offset commits")
        self.partition_resets = counter(
            "partition_resets", "Partitions restarted uncommitted: group membership lost, or a log reset"
        )
        # Every log-reset verdict (kafka/log_reset.py): acted on, refused past the bound, or a log end
        # that the records just fetched contradict. Anything but a rare `repositioned` means a broker
        # reporting wrong log ends.
        self.log_resets = counter(
            "log_resets", "Log-reset verdicts: repositioned, contradicted (no reset), refused", ("outcome",)
        )

    def _histograms(self, named: _Named) -> None:
        histogram = named.histogram
        self.batch_jobs = histogram("batch_jobs", "Jobs per forward batch", _SIZE_BUCKETS)
        self.batch_items = histogram("batch_items", "Items (scored rows) per forward batch", _SIZE_BUCKETS)
        # Padding-free: the jobs' own tokens (the engine packs sequences end to end, nothing is padded),
        # so the ratio to max_batch_tokens is how full the batches run.
        self.batch_tokens = histogram("batch_tokens", "Tokens per forward batch, padding-free", _SIZE_BUCKETS)
        self.queue_seconds = histogram("queue_seconds", "Job wait before its batch starts", _LATENCY)
        self.job_age_seconds = histogram(
            "job_age_seconds", "Record timestamp to its forward pass starting (Kafka backlog included)", _AGE
        )
        self.compute_seconds = histogram("compute_seconds", "Forward pass time per batch", _LATENCY)
        self.e2e_seconds = histogram("end_to_end_seconds", "Record fetched to result acknowledged", _LATENCY)

    def _gauges(self, named: _Named) -> None:
        gauge = named.gauge
        self.inflight_tokens = gauge("inflight_tokens", "Tokens of jobs fetched and not yet answered")
        self.inflight_jobs = gauge("inflight_jobs", "Records fetched and not yet answered")
        self.paused_partitions = gauge("paused_partitions", "Partitions paused by backpressure")
        self.queued_tokens = gauge("queued_tokens", "Tokens of prepared jobs waiting for a batch")
        # The signal an autoscaler reads (KEDA, an HPA on Prometheus): records of each partition not
        # yet answered and committed, from the last fetch's high watermark.
        self.consumer_lag = gauge(
            "consumer_lag",
            "Records of a partition past the worker's committed offset (high watermark - committed)",
            ("topic", "partition"),
        )
        # Seconds on end mean the cluster is not acknowledging results: too few in-sync replicas, or no
        # leader (kafka/send_stall.py); /readyz turns red past 10 s.
        self.send_stalled = gauge(
            "send_stalled_seconds", "Seconds the oldest unacknowledged result send has waited (0: none waits)"
        )

    def describe(self, version: str, served: dict[str, str]) -> None:
        """Set the info metric once at start: version, model, kind, device, dtype, attention backend."""
        self.info.info({"version": version, **served})

    def set_lag(self, lags: dict[tuple[str, int], int]) -> None:
        """Replace the lag series with these partitions' (a revoked partition's series goes away)."""
        self.consumer_lag.clear()
        for (topic, partition), lag in lags.items():
            self.consumer_lag.labels(topic=topic, partition=str(partition)).set(lag)

    def watch_sends(self, stalled_s: Callable[[], float]) -> None:
        """Read `send_stalled_seconds` from the producer at each scrape (kafka/send_stall.py)."""
        self.send_stalled.set_function(stalled_s)

    def watch_caches(self, engine: Counted) -> None:
        """Export the engine's cache counters (prefix cache, document embeddings) and CUDA graph replays,
        read at each scrape."""
        for cache in ENGINE_SERIES:
            cache.watch(self.registry, engine)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class Readiness:
    """What `/healthz` and `/readyz` answer, from process start to exit.

    The probe server starts first thing (cli/worker.py), before the broker is asked anything and before
    the model loads, which can take minutes: a liveness probe must see a live process meanwhile, not
    a refused port that gets the pod killed in a loop. Until the worker runs, readiness is the start-up
    phase, as text (`loading model ...`); then it follows the worker's own reason (service.py)."""

    def __init__(self, phase: str = "starting") -> None:
        self._phase = phase
        self._not_ready: Callable[[], str | None] | None = None
        self._healthy: Callable[[], bool] = lambda: True

    def starting(self, phase: str) -> None:
        """Where start-up is now: /readyz answers 503 with this text."""
        self._phase = phase

    def follow(self, not_ready: Callable[[], str | None], healthy: Callable[[], bool]) -> None:
        """From now on the worker answers: its reason not to be ready (None: ready), and its health."""
        self._not_ready, self._healthy = not_ready, healthy

    def not_ready(self) -> str | None:
        return self._phase if self._not_ready is None else self._not_ready()

    def healthy(self) -> bool:
        return self._healthy()


class ProbeServer:
    """GET /metrics, /healthz, /readyz on one port; anything else is 404."""

    def __init__(self, metrics: WorkerMetrics, readiness: Readiness, host: str, port: int) -> None:
        self._metrics = metrics
        self._readiness = readiness
        self._host = host
        self._port = port
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            return self._port
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self._host, self._port)
        log.info("metrics and probes on http://%s:%d/metrics", self._host, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 5)
            while (line := await asyncio.wait_for(reader.readline(), 5)) not in (b"\r\n", b"\n", b""):
                del line  # headers are not needed
            parts = request.decode("latin-1").split()
            path = parts[1].split("?", 1)[0] if len(parts) >= 2 else ""
            status, body, ctype = self._route(path)
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n"
            )
            writer.write(head.encode("latin-1") + body)
            await writer.drain()
        except (TimeoutError, ConnectionError, UnicodeDecodeError):
            pass
        finally:
            writer.close()

    def _route(self, path: str) -> tuple[str, bytes, str]:
        if path == "/metrics":
            return "200 OK", self._metrics.render(), CONTENT_TYPE_LATEST
        if path == "/healthz":
            if self._readiness.healthy():
                return "200 OK", b"ok\n", "text/plain"
            return "503 Service Unavailable", b"cannot score\n", "text/plain"
        if path == "/readyz":
            reason = self._readiness.not_ready()
            if reason is None:
                return "200 OK", b"ready\n", "text/plain"
            return "503 Service Unavailable", f"not ready: {reason}\n".encode(), "text/plain; charset=utf-8"
        return "404 Not Found", b"not found\n", "text/plain"
