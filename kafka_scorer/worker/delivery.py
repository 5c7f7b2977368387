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
- `ExactlyOnceDelivery`: one Kafka transaction per `deliver` call (one engine batch, or the rejections
  of one fetch) carrying the results and the offsets they move. A result that finished before an older
  record of its partition waits for it, so no transaction carries a result whose offset it does not
  commit. A failed transaction is aborted and the consumer rewinds to the last committed offsets, so
  the work is redone inside a later transaction. Records bound for a refused topic are answered on the
  default reply topic before the transaction starts; three refused transactions in a row stop the worker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from dataclasses import replace
from typing import Any, Protocol

from kafka_scorer.kafka.errors import KafkaError, MessageSizeTooLargeError, RecordTooLargeError
from kafka_scorer.kafka.fenced_commit import Membership
from kafka_scorer.kafka.offsets import OffsetTracker
from kafka_scorer.kafka.producer import FatalProducerError, Refused, ResultProducer, StaleTransaction
from kafka_scorer.kafka.records import OutRecord, TopicPartition
from kafka_scorer.kafka.retry import Backoff, is_retriable
from kafka_scorer.wire.protocol import ErrorCode, Result, error_result
from kafka_scorer.wire.provenance import ServedModel
from kafka_scorer.worker.envelope import Origin, RecordCodec
from kafka_scorer.worker.logs import one_line
from kafka_scorer.worker.metrics import WorkerMetrics
from kafka_scorer.worker.ticket import Ticket
from kafka_scorer.worker.transaction_fence import Floors, claim

log = logging.getLogger(__name__)

_TOO_LARGE = (MessageSizeTooLargeError, RecordTooLargeError)
_REFUSED_TRANSACTIONS = 3  # transactions refused in a row (not broker trouble) before the worker stops


class Committer(Protocol):
    """The consumer as delivery commits through it."""

    def commit(self, offsets: dict[TopicPartition, int]) -> Awaitable[dict[TopicPartition, int]]: ...

    def committable(self, offsets: dict[TopicPartition, int]) -> dict[TopicPartition, int]: ...

    def membership(self) -> Membership | None: ...


class Rewinder(Protocol):
    """Exactly-once recovery (rebalance.py): forget in-flight work, read again from committed offsets."""

    def rewind(self) -> Awaitable[None]: ...


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


class Delivery:
    """Shared parts: turning results into records that can actually be produced."""

    def __init__(
        self,
        producer: ResultProducer,
        tracker: OffsetTracker[TopicPartition],
        metrics: WorkerMetrics,
        served: ServedModel,
        *,
        codec: RecordCodec,
    ) -> None:
        self.producer = producer
        self.tracker = tracker
        self.metrics = metrics
        self.served = served
        self.codec = codec

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
    def __init__(
        self,
        producer: ResultProducer,
        tracker: OffsetTracker[TopicPartition],
        metrics: WorkerMetrics,
        served: ServedModel,
        consumer: Committer,
        *,
        codec: RecordCodec,
    ) -> None:
        super().__init__(producer, tracker, metrics, served, codec=codec)
        self._consumer = consumer
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


class ExactlyOnceDelivery(Delivery):
    def __init__(
        self,
        producer: ResultProducer,
        tracker: OffsetTracker[TopicPartition],
        metrics: WorkerMetrics,
        served: ServedModel,
        consumer: Committer,
        rewinder: Rewinder,
        *,
        group_id: str,
        codec: RecordCodec,
    ) -> None:
        super().__init__(producer, tracker, metrics, served, codec=codec)
        self._consumer = consumer  # its guards (membership held, within the log end) limit each commit
        self._rewinder = rewinder
        self._group_id = group_id
        self._txn_lock = asyncio.Lock()
        self._backoff = Backoff()
        self._held: list[Ticket[Any]] = []  # answered, waiting for an older record of the same partition
        self._refusals = 0  # transactions refused (not merely failed) in a row
        self._floors = Floors()

    async def deliver(self, tickets: Sequence[Ticket[Any]]) -> None:
        """Commit, in one transaction, every ticket its partition's watermark has now passed.

        An ticket that overtook an older record of its partition is held back (not produced) until
        that record is answered too: a transaction may only carry results whose offsets it commits,
        or a crash would make the next owner produce them again, visibly, in another transaction.
        """
        async with self._txn_lock:
            for ticket in self._drop_closed(tickets):
                ticket.watermark.answered(ticket.offset)
                self._held.append(ticket)
            ready: list[Ticket[Any]] = []
            held: list[Ticket[Any]] = []
            for ticket in self._held:
                mark = ticket.watermark
                passed = mark.commit_offset()
                if mark.closed:
                    ticket.settle(None)
                elif passed is not None and ticket.offset < passed:
                    ready.append(ticket)
                else:
                    held.append(ticket)
            self._held = held
            offsets = self.tracker.to_commit()
            ready, offsets = self._within_guards(ready, offsets)
            if not ready:
                return
            taken = claim(self._consumer.membership(), ready)  # with the offsets, before any await
            built = [await self._producible(a) for a in ready]
            records = [r for _, recs in built for r in recs]
            try:
                still_ours = taken.holds(self._consumer.membership)
                await self.producer.send_transaction(records, offsets, self._group_id, still_ours)
            except FatalProducerError:
                raise
            except StaleTransaction:
                # Its other partitions' watermarks still count these answers as given: rewound like any
                # aborted transaction, or the next one would commit past records never answered.
                log.warning(
                    "transaction of %d results aborted before its commit: the group membership or a "
                    "partition its offsets were taken under is gone; rewinding to committed offsets",
                    len(ready),
                )
                await self._rewinder.rewind()
                for ticket in [*ready, *self._held]:
                    ticket.settle(None)
                self._held = []
                return
            except Exception as exc:  # catch-all, on purpose: whatever failed the transaction aborted it,
                # so the work is redone from the committed offsets; refusals in a row stop the worker
                self._refusals = self._refusals + 1 if not is_retriable(exc) else 0
                if self._refusals >= _REFUSED_TRANSACTIONS:
                    raise Undeliverable(
                        f"{self._refusals} transactions in a row refused ({exc!r}); stopping with their "
                        "offsets uncommitted (check the reply and dead-letter topics' ACLs and size limits)"
                    ) from exc
                log.error(
                    "transaction of %d results failed (%r); aborted, rewinding to committed offsets",
                    len(ready),
                    exc,
                )
                await self._rewinder.rewind()
                for ticket in [*ready, *self._held]:
                    ticket.settle(None)
                self._held = []
                await self._backoff.sleep()
                return
            self._backoff.reset()
            self._refusals = 0
            self.tracker.committed(offsets)
            self._floors.committed(offsets)
            for ticket, (result, records) in zip(ready, built, strict=True):
                if ticket.dead_letter is not None and ticket.dead_letter in records:
                    self._dead_lettered(ticket, ticket.dead_letter)
                ticket.settle(result)

    def _within_guards(
        self, ready: list[Ticket[Any]], offsets: dict[TopicPartition, int]
    ) -> tuple[list[Ticket[Any]], dict[TopicPartition, int]]:
        """Drop the tickets of partitions whose offsets may not be committed now (membership lost, or a
        log reset): a transaction must not carry results whose offsets it cannot commit."""
        allowed = self._consumer.committable(offsets)
        if allowed == offsets:
            return ready, offsets
        keep = []
        for ticket in ready:
            if ticket.tp in allowed:
                keep.append(ticket)
            else:
                ticket.settle(None)
        return keep, allowed

    async def _producible(self, ticket: Ticket[Any]) -> tuple[Result, list[OutRecord]]:
        """The ticket's records, each bound for a topic the broker has and lets us write: one refused
        record would abort its whole transaction, and the redo would be refused again, for ever."""
        result, records = self._records(ticket)
        out = []
        for record in records:
            try:
                await self.producer.ensure_topic(record.topic)
            except Refused as exc:
                result, record = self._fallback(ticket, record, exc)
                try:
                    await self.producer.ensure_topic(record.topic)
                except Refused as again:
                    raise Undeliverable(
                        f"cannot ticket {ticket.where} on {record.topic!r} either ({again.cause!r}) "
                        "(setting: reply_topic)"
                    ) from again
            out.append(record)
        return result, out

    async def commit(self, partitions: Sequence[TopicPartition] | None = None) -> None:
        async with self._txn_lock:  # wait for a transaction in flight: its offsets are the commit
            return

    async def settle_in_flight(self) -> None:
        """Wait for the transaction in flight: its claim no longer holds once the caller has closed its
        partitions or lost the membership, so it aborts, unless its commit was already under way."""
        async with self._txn_lock:
            return

    def floors(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        return self._floors.of(partitions)

    def discard_closed(self) -> None:
        keep = []
        for ticket in self._held:
            if ticket.watermark.closed:
                ticket.settle(None)
            else:
                keep.append(ticket)
        self._held = keep
