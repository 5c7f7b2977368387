"""/metrics, /healthz and /readyz on one port, and JSON log lines that carry their fields."""

from __future__ import annotations

import asyncio
import json
import logging

from kafka_scorer.worker.logs import JsonFormatter
from kafka_scorer.worker.metrics import ProbeServer, Readiness, WorkerMetrics


async def _get(port: int, path: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    response = await reader.read()
    writer.close()
    head, _, body = response.decode().partition("\r\n\r\n")
    return int(head.split()[1]), body


async def test_probes_and_metrics_share_one_port() -> None:
    metrics = WorkerMetrics()
    reason: str | None = "loading model m"
    readiness = Readiness()
    readiness.follow(lambda: reason, lambda: True)
    server = ProbeServer(metrics, readiness, "127.0.0.1", 0)
    await server.start()
    try:
        metrics.jobs.inc(3)
        metrics.errors.labels(code="too_long").inc()
        assert await _get(server.port, "/healthz") == (200, "ok\n")
        assert await _get(server.port, "/readyz") == (503, "not ready: loading model m\n")
        reason = None
        assert (await _get(server.port, "/readyz"))[0] == 200
        status, body = await _get(server.port, "/metrics")
        assert status == 200
        assert "kafka_scorer_jobs_total 3.0" in body
        assert 'kafka_scorer_errors_total{code="too_long"} 1.0' in body
        assert "kafka_scorer_end_to_end_seconds_bucket" in body
        assert (await _get(server.port, "/nope"))[0] == 404
    finally:
        await server.stop()


def test_two_workers_in_one_process_have_separate_registries() -> None:
    a, b = WorkerMetrics(), WorkerMetrics()
    a.jobs.inc()
    assert b"kafka_scorer_jobs_total 0.0" in b.render()


def test_json_log_lines_carry_extra_fields() -> None:
    record = logging.LogRecord(
        "kafka_scorer.worker.service", logging.INFO, __file__, 1, "batch jobs=%d", (4,), None
    )
    record.jobs = 4
    record.compute_ms = 1.5
    line = json.loads(JsonFormatter().format(record))
    assert line["msg"] == "batch jobs=4"
    assert line["level"] == "INFO"
    assert line["jobs"] == 4 and line["compute_ms"] == 1.5


def test_info_and_lag_series() -> None:
    """The info metric carries what is served; lag series follow the partitions handed in (a revoked
    partition's series disappears instead of freezing at its last value)."""
    metrics = WorkerMetrics()
    metrics.describe("1.2.3", {"model": "m", "kind": "causal_lm", "device": "cpu", "dtype": "float32"})
    metrics.set_lag({("req", 0): 7, ("req", 1): 0})
    text = metrics.render().decode()
    assert (
        'kafka_scorer_info{device="cpu",dtype="float32",kind="causal_lm",model="m",version="1.2.3"} 1.0'
        in text
    )
    assert 'kafka_scorer_consumer_lag{partition="0",topic="req"} 7.0' in text
    metrics.set_lag({("req", 1): 3})
    text = metrics.render().decode()
    assert 'partition="0"' not in text and 'kafka_scorer_consumer_lag{partition="1",topic="req"} 3.0' in text
