"""Answer, then commit: the delivery rules of SPEC §7 in one place.

Every consumed record becomes a `Ticket` (ticket.py), and every ticket ends in exactly one `settle`: either
answered (its result, and dead-letter copy if any, acknowledged by the broker) or dropped (its partition
was revoked or rewound before that happened, so the partition's next reader redoes it). Offsets only move
through answered tickets, so a commit never passes an unanswered record.

- `AtLeastOnceDelivery`: each answer is sent on its own and acknowledged; a committer task commits the
  per-partition watermarks through the consumer, coalescing acknowledgements that arrive while a commit
  is in flight. A crash between acknowledgement and commit repeats those jobs (duplicates, never losses).
  An answer the broker refuses for good goes to the default reply topic as an error result; one that
  cannot go anywhere stops the worker (`Undeliverable`) with its offset uncommitted. Nothing is skipped.
- `ExactlyOnceDelivery` (exactly_once.py): one Kafka transaction per `deliver` call, carrying the
  results and the offsets they move; built on the shared parts here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from kafka_scorer.kafka.errors import KafkaError, MessageSizeTooLargeError, RecordTooLargeError
from kafka_scorer.kafka.fenced_commit import Membership
from kafka_scorer.kafka.offsets import OffsetTracker
from kafka_scorer.kafka.producer import FatalProducerError, Refused, ResultProducer
from kafka_scorer.kafka.records import OutRecord, TopicPartition
from kafka_scorer.kafka.retry import Backoff
from kafka_scorer.wire.protocol import ErrorCode, Result, error_result
from kafka_scorer.wire.provenance import ServedModel
from kafka_scorer.worker.envelope import Origin, RecordCodec
from kafka_scorer.worker.logs import one_line
from kafka_scorer.worker.metrics import WorkerMetrics
from kafka_scorer.worker.ticket import Ticket

log = logging.getLogger(__name__)

_TOO_LARGE = (MessageSizeTooLargeError, RecordTooLargeError)


class Committer(Protocol):
    """The consumer as delivery commits through it."""

    def commit(self, offsets: dict[TopicPartition, int]) -> Awaitable[dict[TopicPartition, int]]: ...

    def committable(self, offsets: dict[TopicPartition, int]) -> dict[TopicPartition, int]: ...

    def membership(self) -> Membership | None: ...


class Undeliverable(FatalProducerError):
    """An answer that no topic will take: the worker stops without committing its record's offset."""


def _answered(ticket: Ticket[Any]) -> Result:
    """The ticket's result: only answered tickets reach delivery."""
    if ticket.result is None:
        raise RuntimeError(f"{ticket.where} reached delivery without a result")
    return ticket.result


def _reply_origin(ticket: Ticket[Any], reply_topic: str | None = None) -> Origin:
    """The ticket's origin (its reply topic replaced if given) with the trace context its result
    carries: the `produce` span's where spans are recorded, else the job's own headers."""
    origin = ticket.origin if reply_topic is None else replace(ticket.origin, reply_topic=reply_topic)
    trace = ticket.trace.outgoing(origin.trace, origin.reply_topic)
    return origin if trace is origin.trace else replace(origin, trace=trace)


@dataclass(frozen=True)
class DeliveryParts:
    """What either delivery mode is built from (worker/service.py builds it once)."""

    producer: ResultProducer
    tracker: OffsetTracker[TopicPartition]
    metrics: WorkerMetrics
    served: ServedModel
    consumer: Committer
    """Commits through it; its guards (membership held, within the log end) limit each commit."""
    codec: RecordCodec


class Delivery:
    """Shared parts: turning results into records that can actually be produced."""

    def __init__(self, parts: DeliveryParts) -> None:
        self.producer = parts.producer
        self.tracker = parts.tracker
        self.metrics = parts.metrics
        self.served = parts.served
        self.codec = parts.codec
        self._consumer = parts.consumer

    def _records(self, ticket: Ticket[Any]) -> tuple[Result, list[OutRecord]]:
        """The ticket's records; a result too large to produce becomes a `too_long` error result."""
        result = self.served.stamp(_answered(ticket))
        origin = _reply_origin(ticket)
        record = self.codec.encode_record(result, origin)
        if not self.producer.fits(record):
            size = len(record.value or b"")
            result = error_result(
                result.id,
                ErrorCode.TOO_LONG,
                f"result is {size} bytes, over the producer limit of {self.producer.max_request_size} bytes "
                f"(max_message_bytes + 1 MiB); ask for fewer items or no pooled hidden states",
            )
            record = self.codec.encode_record(self.served.stamp(result), origin)
        records = [record]
        dead = ticket.dead_letter
        if dead is not None:
            if self.producer.fits(dead):
                records.insert(0, dead)
            else:
                log.error(
                    "dead-letter copy of %s:%d is too large to produce; skipped",
                    dead.topic,
                    ticket.offset,
                )
        return result, records

    def _dead_lettered(self, ticket: Ticket[Any], record: OutRecord) -> None:
        """Count the copy and say so in one line: the record is out of the request topic's way now."""
        self.metrics.dead_letters.inc()
        error = _answered(ticket).error
        log.warning(
            "dead-lettered %s to %s (job %s): %s",
            ticket.where,
            record.topic,
            _answered(ticket).id,
            one_line(error.message) if error is not None else "-",
            extra={"job_id": _answered(ticket).id, "dead_letter_topic": record.topic},
        )

    def _drop_closed(self, tickets: Sequence[Ticket[Any]]) -> list[Ticket[Any]]:
        live = []
        for ticket in tickets:
            if ticket.watermark.closed:
                ticket.settle(None)
            else:
                live.append(ticket)
        return live

    def _fallback(self, ticket: Ticket[Any], record: OutRecord, refused: Refused) -> tuple[Result, OutRecord]:
        """What to send instead of a record the broker refused for good: an error result on the default
        reply topic where that can help; otherwise `Undeliverable`, leaving the ticket unanswered.

        Never "log and move on": the offset would be committed with no ticket anywhere, which breaks
        at-least-once (SPEC §7). Stopping instead leaves the record uncommitted for the next worker, and
        the operator one line naming the topic and the setting to fix.
        """
        where = ticket.where
        if record is ticket.dead_letter:
            raise Undeliverable(
                f"cannot copy {where} to the dead-letter topic {record.topic!r} ({refused.cause!r}); "
                "create it or grant this worker write access (setting: dead_letter_topic)"
            ) from refused
        too_large = isinstance(refused.cause, _TOO_LARGE)
        if record.topic == self.codec.reply_topic and not too_large:
            raise Undeliverable(
                f"cannot ticket {where} (job {_answered(ticket).id}) on the reply topic {record.topic!r} "
                f"({refused.cause!r}); create it or grant this worker write access (setting: reply_topic)"
            ) from refused
        code, why = (
            (ErrorCode.TOO_LONG, "is over the topic's size limit")
            if too_large
            else (ErrorCode.INVALID_REQUEST, "refused it")
        )
        result = error_result(
            _answered(ticket).id,
            code,
            f"cannot produce the result to reply topic {record.topic!r}: "
            f"the broker {why} ({refused.cause!r})",
        )
        result = self.served.stamp(result)
        return result, self.codec.encode_record(result, _reply_origin(ticket, self.codec.reply_topic))

    async def deliver(self, tickets: Sequence[Ticket[Any]]) -> None:
        raise NotImplementedError

    async def commit(self, partitions: Sequence[TopicPartition] | None = None) -> None:
        """Commit what is committable now (at-least-once); transactions commit as they go."""

    def discard_closed(self) -> None:
        """Settle, as dropped, tickets still held for partitions that were just revoked."""

    async def settle_in_flight(self) -> None:
        """Return once no transaction is in flight (exactly-once); at-least-once commits are fenced by
        membership already (kafka/fenced_commit.py)."""

    def floors(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        """What this worker's transactions committed of `partitions` (worker/transaction_fence.py)."""
        return {}

    async def run(self) -> None:
        """Background work (the committer); returns only when cancelled."""
        await asyncio.Event().wait()


class AtLeastOnceDelivery(Delivery):
    def __init__(self, parts: DeliveryParts) -> None:
        super().__init__(parts)
        self._commit_lock = asyncio.Lock()
        self._poke = asyncio.Event()

    async def deliver(self, tickets: Sequence[Ticket[Any]]) -> None:
        await asyncio.gather(*(self._answer(a) for a in self._drop_closed(tickets)))

    async def _answer(self, ticket: Ticket[Any]) -> None:
        result, records = self._records(ticket)
        for record in records:
            try:
                await self.producer.send(record)
            except Refused as exc:
                result = await self._answer_elsewhere(ticket, record, exc)
            else:
                if record is ticket.dead_letter:
                    self._dead_lettered(ticket, record)
        if ticket.watermark.answered(ticket.offset):
            ticket.settle(result)
            self._poke.set()
        else:
            ticket.settle(None)

    async def _answer_elsewhere(self, ticket: Ticket[Any], record: OutRecord, refused: Refused) -> Result:
        """Send the fallback for a refused record; a fallback refused too is `Undeliverable`."""
        result, moved = self._fallback(ticket, record, refused)
        try:
            await self.producer.send(moved)
        except Refused as exc:
            raise Undeliverable(
                f"cannot ticket {ticket.where} (job {_answered(ticket).id}) on {record.topic!r} "
                f"({refused.cause!r}) nor on the reply topic {moved.topic!r} ({exc.cause!r}) "
                "(setting: reply_topic)"
            ) from exc
        log.warning(
            "%s refused the result of %s (%r); answered on %s",
            record.topic,
            ticket.where,
            refused,
            moved.topic,
        )
        return result

    async def commit(self, partitions: Sequence[TopicPartition] | None = None) -> None:
        async with self._commit_lock:
            offsets = self.tracker.to_commit(partitions)
            if not offsets:
                return
            self.tracker.committed(await self._consumer.commit(offsets))

    async def run(self) -> None:
        backoff = Backoff()
        while True:
            await self._poke.wait()
            self._poke.clear()
            try:
                await self.commit()
                backoff.reset()
            except KafkaError as exc:
                self.metrics.commit_failures.inc()
                log.warning("commit failed (%r); retrying in %.1fs", exc, backoff.next_s)
                await backoff.sleep()
                self._poke.set()
