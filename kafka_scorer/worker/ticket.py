"""One consumed record on its way through the worker: the one object that carries a job's state.

A `Ticket` is opened by the ledger when its record is fetched (its offset joins the partition's
watermark), prepared by intake, queued and computed by the batcher, answered and produced by delivery,
and settled exactly once: `settle(result)` when its answer is acknowledged, `settle(None)` when it is
dropped (its partition was revoked or rewound first, so the partition's next reader redoes it). Every
stage reads and writes the ticket itself; nothing maps ids back to jobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Protocol

from kafka_scorer.kafka.offsets import Watermark
from kafka_scorer.kafka.records import OutRecord, TopicPartition
from kafka_scorer.wire.protocol import ErrorCode, Result, error_result
from kafka_scorer.worker.engine import P
from kafka_scorer.worker.envelope import Origin
from kafka_scorer.worker.tracing import NO_SPANS, JobTrace


class Settles(Protocol):
    """Where a ticket reports its end (ledger.py's `Ledger`, which holds the tickets: named by what it
    does here, so ticket and ledger do not import each other)."""

    def settle(self, ticket: Ticket, result: Result | None) -> None: ...


@dataclass(slots=True, eq=False)
class Ticket(Generic[P]):
    tp: TopicPartition
    origin: Origin
    job_id: str
    watermark: Watermark
    received_at: float  # monotonic, when the record was fetched
    ledger: Settles
    trace: JobTrace = NO_SPANS
    born: float = 0.0  # monotonic instant of the record's timestamp (deadline.py)
    priority: int = 0  # the job's, else its topic's default
    deadline: float | None = None  # monotonic; None: never expires
    items: int = 0
    prepared: P | None = None  # the engine's prepared job, once prepare is done
    tokens: int = 0  # counted in the ledger's in-flight tokens from queueing to settling
    enqueued_at: float = 0.0  # monotonic, when it joined the batcher
    queue_s: float = 0.0  # enqueue -> its forward pass started
    result: Result | None = None  # the answer, once there is one
    dead_letter: OutRecord | None = None  # an untouched copy for the dead-letter topic, with the answer

    @property
    def offset(self) -> int:
        return self.origin.offset

    @property
    def num_tokens(self) -> int:
        """What the token budget spends on this job (the scheduler's unit)."""
        return self.tokens

    @property
    def where(self) -> str:
        return f"{self.tp.topic}:{self.tp.partition}@{self.offset}"

    def answer(self, result: Result, dead_letter: OutRecord | None = None) -> Ticket[P]:
        """Attach the answer to deliver."""
        self.result = result
        self.dead_letter = dead_letter
        return self

    def expired(self, now: float) -> bool:
        return self.deadline is not None and self.deadline <= now

    def expire(self, now: float) -> Ticket[P]:
        """Answer `deadline_exceeded`: its sender stopped waiting before its forward pass could start."""
        age_ms = (now - self.born) * 1000
        message = (
            f"the job's deadline passed before its forward pass started ({age_ms:.0f} ms after its record's "
            "timestamp; timeout_ms, or the worker's max_job_age_ms): not computed"
        )
        return self.answer(error_result(self.job_id, ErrorCode.DEADLINE_EXCEEDED, message))

    def fail(self, stage: str, exc: BaseException) -> Ticket[P]:
        """Answer `internal`: the one place on the worker's side where an exception becomes an answer
        (a bug by definition: the engine and the record reader answer every bad input themselves)."""
        message = f"{stage} failed: {type(exc).__name__}: {exc}"[:1000]
        return self.answer(error_result(self.job_id, ErrorCode.INTERNAL, message))

    def settle(self, result: Result | None) -> None:
        """The end of the ticket: answered with `result`, or dropped (None) for the next reader."""
        self.ledger.settle(self, result)
