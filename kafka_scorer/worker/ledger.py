"""The in-flight ledger: every ticket opens and settles here, so counts, watermarks and backpressure
have one owner.

- **Watermarks.** Opening a ticket registers its offset in its partition's watermark (offsets.py);
  answering it lets the watermark pass, and the committer commits only what lies below the oldest
  unanswered record.
- **Counts.** Records and tokens in flight (fetched and not yet settled), with their high-water marks:
  what backpressure actually allowed.
- **Backpressure.** Above `max_inflight_tokens` tokens (or four polls' worth of records, which bounds the
  answers not counted in tokens) the consumer pauses the partitions of its lower-priority topics
  (`topic_priorities`) first; a quarter above the budget, or with no lower topic to pause, all of them.
  Below half of both it resumes them all: the hysteresis keeps it from flapping. Paused partitions are
  still polled, so the group membership stays alive.
- **Settling.** Metrics, the error-result log line and the job's trace end are written once per ticket,
  and waiters (a rebalance settling its partitions, a drain) are woken.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any, Protocol

from aiokafka import TopicPartition

from kafka_scorer.config import Settings
from kafka_scorer.wire.protocol import ErrorCode, Result
from kafka_scorer.worker.logs import one_line
from kafka_scorer.worker.metrics import WorkerMetrics
from kafka_scorer.worker.offsets import OffsetTracker
from kafka_scorer.worker.ticket import Ticket
from kafka_scorer.worker.tracing import NO_SPANS, JobTrace
from kafka_scorer.worker.wire import Origin

log = logging.getLogger(__name__)

_RECORDS_PER_POLL_IN_FLIGHT = 4  # in-flight records cap, in polls' worth
# Error results the client caused (its job, its record, or its deadline passing under load: counted in
# the expired metric) log at INFO; the rest are the worker's to fix.
_CLIENT_ERRORS = frozenset(
    {
        ErrorCode.INVALID_MESSAGE,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.TOO_LONG,
        ErrorCode.UNSUPPORTED,
        ErrorCode.MODEL_MISMATCH,
        ErrorCode.DEADLINE_EXCEEDED,
    }
)


class Pausable(Protocol):
    """The consumer as backpressure drives it."""

    def pause(self, partitions: Iterable[TopicPartition] | None = None) -> None: ...

    def resume(self) -> None: ...

    def paused(self) -> set[TopicPartition]: ...

    def assignment(self) -> set[TopicPartition]: ...


class Ledger:
    def __init__(self, settings: Settings, metrics: WorkerMetrics, consumer: Pausable) -> None:
        self.metrics = metrics
        self.consumer = consumer
        self.tracker: OffsetTracker[TopicPartition] = OffsetTracker()
        self.max_tokens = settings.max_inflight_tokens
        self.max_jobs = _RECORDS_PER_POLL_IN_FLIGHT * settings.max_poll_records
        self.topic_priorities = dict(settings.topic_priorities)
        self.jobs = 0
        self.tokens = 0
        self.peak_jobs = 0
        self.peak_tokens = 0
        self.resumes = 0
        self.paused = False  # some partitions are paused by backpressure
        self.paused_all = False  # ... and all of them, not only the lower-priority topics'
        self.started = False  # the consumer has started (before that it has no partitions to count)
        self.draining = False  # shutting down: backpressure may still pause, but never resumes
        self._settled = asyncio.Event()

    # ---- a ticket's life -------------------------------------------------------------------------

    def open(
        self, tp: TopicPartition, origin: Origin, job_id: str, trace: JobTrace = NO_SPANS
    ) -> Ticket[Any]:
        """A fetched record becomes a ticket; its offset now holds back its partition's commits."""
        mark = self.tracker.watermark(tp)
        try:
            mark.received(origin.offset)
        except ValueError:  # the position moved back (a seek): older in-flight work is moot
            log.warning("%s went back to offset %d; restarting its watermark", tp, origin.offset)
            self.tracker.revoke([tp])
            mark = self.tracker.watermark(tp)
            mark.received(origin.offset)
        self.jobs += 1
        self.peak_jobs = max(self.peak_jobs, self.jobs)
        return Ticket(tp, origin, job_id, mark, time.monotonic(), self, trace)

    def queued(self, ticket: Ticket[Any], tokens: int) -> None:
        """The ticket's job joins the batcher: its tokens count until it settles."""
        ticket.tokens = tokens
        ticket.enqueued_at = time.monotonic()
        self.tokens += tokens
        self.peak_tokens = max(self.peak_tokens, self.tokens)
        self.backpressure()

    def settle(self, ticket: Ticket[Any], result: Result | None) -> None:
        """Called once per ticket (through `Ticket.settle`): answered, or dropped when `result` is None."""
        ticket.trace.end(result)
        self.jobs -= 1
        self.tokens -= ticket.tokens
        m = self.metrics
        if result is None:
            m.dropped.inc()
        else:
            m.jobs.inc()
            m.e2e_seconds.observe(time.monotonic() - ticket.received_at)
            if result.error is not None:
                m.errors.labels(code=result.error.code.value).inc()
                if result.error.code is ErrorCode.DEADLINE_EXCEEDED:
                    m.expired.labels(priority=str(ticket.priority)).inc()
                _log_error_result(ticket, result)
            elif result.scores is not None:
                m.items.inc(len(result.scores))
        self._settled.set()
        self.backpressure()

    async def settled(self, partitions: Iterable[TopicPartition], deadline: float) -> None:
        """Wait until the partitions have nothing unanswered, or until `deadline` (monotonic)."""
        partitions = list(partitions)
        while self.tracker.unanswered(partitions) and time.monotonic() < deadline:
            self._settled.clear()
            try:
                await asyncio.wait_for(self._settled.wait(), max(0.001, deadline - time.monotonic()))
            except TimeoutError:
                return

    # ---- backpressure ----------------------------------------------------------------------------

    def backpressure(self) -> None:
        """Pause above the in-flight budget (lower-priority topics first), resume below half of it."""
        over = self.tokens > self.max_tokens or self.jobs > self.max_jobs
        far_over = self.tokens > self.max_tokens * 5 // 4 or self.jobs > self.max_jobs * 5 // 4
        under = self.tokens <= self.max_tokens // 2 and self.jobs <= self.max_jobs // 2
        if over and not self.paused_all:
            low = self.lower_partitions(self.consumer.assignment())
            first = not self.paused
            if low and not far_over:
                self.consumer.pause(low)
            else:
                self.consumer.pause()
                self.paused_all = True
            self.paused = True
            if first:
                self.metrics.pauses.inc()
                log.debug("backpressure: paused (%d tokens, %d jobs in flight)", self.tokens, self.jobs)
        elif self.paused and under:
            self.paused = self.paused_all = False
            self.resumes += 1
            if not self.draining:
                self.consumer.resume()
            log.info("backpressure: resumed (%d tokens in flight)", self.tokens)
        self.metrics.inflight_tokens.set(self.tokens)
        self.metrics.inflight_jobs.set(self.jobs)
        self.metrics.paused_partitions.set(len(self.consumer.paused()) if self.started else 0)

    def lower_partitions(self, partitions: Iterable[TopicPartition]) -> set[TopicPartition]:
        """The partitions whose topic's default priority is below the highest among `partitions`."""
        partitions = set(partitions)
        priority = {tp: self.topic_priorities.get(tp.topic, 0) for tp in partitions}
        top = max(priority.values(), default=0)
        return {tp for tp, p in priority.items() if p < top}

    def held(self, assigned: set[TopicPartition]) -> set[TopicPartition]:
        """Of newly assigned partitions, those backpressure (or a drain) keeps paused right away."""
        if self.draining or self.paused_all:
            return assigned
        return (
            self.lower_partitions(self.consumer.assignment() | assigned) & assigned if self.paused else set()
        )


def _log_error_result(ticket: Ticket[Any], result: Result) -> None:
    """One line per error result: INFO for the client's mistakes (the result tells the client), WARNING
    for the worker's own (`internal`)."""
    assert result.error is not None
    code = result.error.code
    log.log(
        logging.INFO if code in _CLIENT_ERRORS else logging.WARNING,
        "error result for job %s (%s[%d]@%d): %s: %s",
        result.id,
        ticket.tp.topic,
        ticket.tp.partition,
        ticket.offset,
        code.value,
        one_line(result.error.message),
        extra={"job_id": result.id, "error_code": code.value},
    )
