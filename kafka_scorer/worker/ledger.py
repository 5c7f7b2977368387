"""The in-flight ledger: every ticket opens and settles here, so counts, watermarks and backpressure
have one owner.

- **Watermarks.** Opening a ticket registers its offset in its partition's watermark (kafka/offsets.py);
  answering it lets the watermark pass, and the committer commits only what lies below the oldest
  unanswered record.
- **Counts.** Records and tokens in flight (fetched and not yet settled), with their high-water marks:
  what backpressure actually allowed.
- **Backpressure.** Two tiers of partitions: the top one (the request topics of the highest default
  priority, `topic_priorities`) and the lower one (the rest). The lower tier pauses when all in-flight
  work passes `max_inflight_tokens` (or four polls' worth of records, which bounds the answers not
  counted in tokens); the top tier only when the work of its priority or above passes it on its own,
  or all work passes twice the budget, or the record cap. So a bulk backlog never stops interactive
  records from being read, and on one shared topic jobs sent below the topic's priority (bulk at
  `priority` -1 beside interactive jobs at the default) may fill the second budget: the worker reads
  twice as far ahead into a bulk backlog before it pauses, and the jobs it reads behind it get priority
  over it. Each tier resumes below half of what paused it: the hysteresis keeps it from flapping. With
  one priority everywhere this is the plain rule: pause above the budget, resume below half of it.
  Paused partitions are still polled, so the group membership stays alive.
- **Settling.** Metrics, the error-result log line and the job's trace end are written once per ticket,
  and waiters (a rebalance settling its partitions, a drain) are woken.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any, Protocol

from kafka_scorer.config import Settings
from kafka_scorer.kafka.offsets import OffsetTracker
from kafka_scorer.kafka.records import TopicPartition
from kafka_scorer.wire.protocol import ErrorCode, Result
from kafka_scorer.worker.envelope import Origin
from kafka_scorer.worker.logs import one_line
from kafka_scorer.worker.metrics import WorkerMetrics
from kafka_scorer.worker.ticket import Ticket
from kafka_scorer.worker.tracing import NO_SPANS, JobTrace

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

    def resume(self, partitions: Iterable[TopicPartition] | None = None) -> None: ...

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
        self.paused_low = False  # the lower tier's partitions are paused by backpressure
        self.paused_top = False  # ... and the top tier's
        self._tokens_by_priority: dict[int, int] = {}  # in-flight tokens of queued jobs, by their priority
        self.started = False  # the consumer has started (before that it has no partitions to count)
        self.draining = False  # shutting down: backpressure may still pause, but never resumes
        self._settled = asyncio.Event()
        # read when scraped: setting them on each change cost a third of backpressure's time, twice a job
        metrics.inflight_tokens.set_function(lambda: self.tokens)
        metrics.inflight_jobs.set_function(lambda: self.jobs)
        metrics.paused_partitions.set_function(self._paused_partitions)

    # ---- a ticket's life -------------------------------------------------------------------------

    def open(
        self, tp: TopicPartition, origin: Origin, job_id: str, trace: JobTrace = NO_SPANS
    ) -> Ticket[Any]:
        """A fetched record becomes a ticket; its offset now holds back its partition's commits."""
        mark = self.tracker.watermark(tp)
        if mark.received(origin.offset) and mark.repeats == 1:  # said once per assignment
            log.warning(
                "%s[%d]: offset %d handed out again (the broker gave two records one offset, or the "
                "position was reset back); every job is answered, commits wait for the lowest unanswered",
                tp.topic,
                tp.partition,
                origin.offset,
            )
        self.jobs += 1
        self.peak_jobs = max(self.peak_jobs, self.jobs)
        return Ticket(tp, origin, job_id, mark, time.monotonic(), self, trace)

    def queued(self, ticket: Ticket[Any], tokens: int) -> None:
        """The ticket's job joins the batcher: its tokens count until it settles."""
        ticket.tokens = tokens
        ticket.enqueued_at = time.monotonic()
        self.tokens += tokens
        self.peak_tokens = max(self.peak_tokens, self.tokens)
        by = self._tokens_by_priority
        by[ticket.priority] = by.get(ticket.priority, 0) + tokens
        self.backpressure()

    def settle(self, ticket: Ticket[Any], result: Result | None) -> None:
        """Called once per ticket (through `Ticket.settle`): answered, or dropped when `result` is None."""
        ticket.trace.end(result)
        self.jobs -= 1
        self.tokens -= ticket.tokens
        if ticket.tokens:
            self._tokens_by_priority[ticket.priority] -= ticket.tokens
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

    @property
    def paused(self) -> bool:
        return self.paused_low or self.paused_top

    def backpressure(self) -> None:
        """Pause a tier above its budget, resume it below half of that (see the module docstring).

        Runs twice per job (queued, settled). While nothing is paused and all the work in flight is
        within the budget, no tier can be over it (the top tier's work is part of all of it), so nothing
        changes: the tiers, built from the consumer's assignment, are left unbuilt."""
        if not self.paused and self.tokens <= self.max_tokens and self.jobs <= self.max_jobs:
            return
        low, top = self.tiers(self.consumer.assignment())
        # one priority everywhere: all the work in flight is the top tier's
        top_tokens = self._tokens_at_or_above(self._top_priority(top))
        jobs_under = self.jobs <= self.max_jobs // 2
        over = self.tokens > self.max_tokens or self.jobs > self.max_jobs
        under = self.tokens <= self.max_tokens // 2 and jobs_under
        top_over = (
            top_tokens > self.max_tokens or self.tokens > 2 * self.max_tokens or self.jobs > self.max_jobs
        )
        top_under = top_tokens <= self.max_tokens // 2 and self.tokens <= self.max_tokens and jobs_under
        was_paused = self.paused
        if low and over and not self.paused_low:
            self.paused_low = True
            self.consumer.pause(low)
        if top_over and not self.paused_top:
            self.paused_top = True
            self.consumer.pause(top)
        if self.paused and not was_paused:
            self.metrics.pauses.inc()
            log.debug("backpressure: paused (%d tokens, %d jobs in flight)", self.tokens, self.jobs)
        self._resume(low if under else None, top if top_under else None)

    def _paused_partitions(self) -> int:
        return len(self.consumer.paused()) if self.started else 0

    def _resume(self, low: set[TopicPartition] | None, top: set[TopicPartition] | None) -> None:
        """Resume each paused tier whose work is under half of what paused it (None: it is not)."""
        resumed: set[TopicPartition] = set()
        flipped = False
        if self.paused_low and low is not None:
            self.paused_low, flipped = False, True
            resumed |= low
        if self.paused_top and top is not None:
            self.paused_top, flipped = False, True
            resumed |= top
        if flipped:
            self.resumes += 1
            if not self.draining and resumed:
                self.consumer.resume(resumed)
            log.info("backpressure: resumed (%d tokens in flight)", self.tokens)

    def tiers(self, partitions: Iterable[TopicPartition]) -> tuple[set[TopicPartition], set[TopicPartition]]:
        """(lower, top): the partitions whose topic's default priority is below the highest among
        `partitions`, and the rest."""
        partitions = set(partitions)
        top = self._top_priority(partitions)
        low = {tp for tp in partitions if self.topic_priorities.get(tp.topic, 0) < top}
        return low, partitions - low

    def held(self, assigned: set[TopicPartition]) -> set[TopicPartition]:
        """Of newly assigned partitions, those backpressure (or a drain) keeps paused right away."""
        if self.draining:
            return assigned
        low, top = self.tiers(self.consumer.assignment() | assigned)
        return ((low if self.paused_low else set()) | (top if self.paused_top else set())) & assigned

    def _top_priority(self, partitions: Iterable[TopicPartition]) -> int:
        return max((self.topic_priorities.get(tp.topic, 0) for tp in partitions), default=0)

    def _tokens_at_or_above(self, priority: int) -> int:
        return sum(tokens for p, tokens in self._tokens_by_priority.items() if p >= priority)


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
