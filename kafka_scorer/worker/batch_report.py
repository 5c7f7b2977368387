"""What a finished batch leaves behind for people and dashboards: metrics, one log line, and its spans.

The batch and forward spans are written after the fact: the batch formed when its oldest job was queued,
and its forward pass started when every job's queue wait ended.
"""

from __future__ import annotations

import logging
from typing import Any

from kafka_scorer.worker.batcher import BatchDone
from kafka_scorer.worker.metrics import WorkerMetrics
from kafka_scorer.worker.tracing import Tracing

log = logging.getLogger(__name__)


def report_batch(done: BatchDone[Any], metrics: WorkerMetrics, tracing: Tracing) -> None:
    tickets = done.tickets
    items = sum(t.items for t in tickets)
    compute_ms = done.compute_s * 1000
    queue_ms = max((t.queue_s for t in tickets), default=0.0) * 1000
    metrics.batches.inc()
    metrics.batch_jobs.observe(len(tickets))
    metrics.batch_items.observe(items)
    metrics.batch_tokens.observe(done.tokens)
    # The budget's tokens less those the engine served from its prefix cache (results' cached_tokens).
    cached = sum(t.result.cached_tokens for t in tickets if t.result is not None)
    metrics.tokens.inc(max(0, done.tokens - cached))
    metrics.cached_tokens.inc(cached)
    metrics.compute_seconds.observe(done.compute_s)
    for ticket in tickets:
        metrics.queue_seconds.observe(ticket.queue_s)
        metrics.job_age_seconds.observe(max(0.0, ticket.enqueued_at + ticket.queue_s - ticket.born))
    log.info(
        "batch jobs=%d items=%d tokens=%d queue_ms=%.1f compute_ms=%.1f",
        len(tickets),
        items,
        done.tokens,
        queue_ms,
        compute_ms,
        extra={"jobs": len(tickets), "items": items, "tokens": done.tokens, "compute_ms": compute_ms},
    )
    if tickets:
        started_at = tickets[0].enqueued_at + tickets[0].queue_s
        tracing.batch(
            [ticket.trace for ticket in tickets],
            formed_at=min(ticket.enqueued_at for ticket in tickets),
            started_at=started_at,
            done_at=started_at + done.compute_s,
            attributes={"jobs": len(tickets), "items": items, "tokens": done.tokens},
        )
