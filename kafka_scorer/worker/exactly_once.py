"""Exactly-once delivery (SPEC §7): one Kafka transaction per `deliver` call (one engine batch, or the
rejections of one fetch) carrying the results and the offsets they move.

A result that finished before an older record of its partition waits for it, so no transaction carries
a result whose offset it does not commit. A failed transaction is aborted and the consumer rewinds to
the last committed offsets, so the work is redone inside a later transaction. Records bound for a
refused topic are answered on the default reply topic before the transaction starts; three refused
transactions in a row stop the worker. The parts shared with at-least-once (records, fallbacks, dropping
the work of closed partitions) are `Delivery`'s (delivery.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from typing import Any, Protocol

from kafka_scorer.kafka.producer import FatalProducerError, Refused, StaleTransaction
from kafka_scorer.kafka.records import OutRecord, TopicPartition
from kafka_scorer.kafka.retry import Backoff, is_retriable
from kafka_scorer.wire.protocol import Result
from kafka_scorer.worker.delivery import Delivery, DeliveryParts, Undeliverable
from kafka_scorer.worker.ticket import Ticket
from kafka_scorer.worker.transaction_fence import Floors, claim

log = logging.getLogger(__name__)

_REFUSED_TRANSACTIONS = 3  # transactions refused in a row (not broker trouble) before the worker stops


class Rewinder(Protocol):
    """Exactly-once recovery (rebalance.py): forget in-flight work, read again from committed offsets."""

    def rewind(self) -> Awaitable[None]: ...


class ExactlyOnceDelivery(Delivery):
    def __init__(self, parts: DeliveryParts, rewinder: Rewinder, *, group_id: str) -> None:
        super().__init__(parts)
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
            ready = self._passed(tickets)
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
                await self._redo(ready)
                return
            except Exception as exc:  # catch-all, on purpose: whatever failed the transaction aborted it,
                # so the work is redone from the committed offsets; refusals in a row stop the worker
                self._count_refusal(exc)
                log.error(
                    "transaction of %d results failed (%r); aborted, rewinding to committed offsets",
                    len(ready),
                    exc,
                )
                await self._redo(ready)
                await self._backoff.sleep()
                return
            self._committed(ready, built, offsets)

    def _passed(self, tickets: Sequence[Ticket[Any]]) -> list[Ticket[Any]]:
        """The answered tickets (these and those held before) that their partition's watermark has
        passed; the rest stay held, and those of closed partitions are dropped."""
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
        return ready

    def _count_refusal(self, exc: Exception) -> None:
        """One more failed transaction: a refusal (not broker trouble) in a row past the bound stops the
        worker with its offsets uncommitted."""
        self._refusals = self._refusals + 1 if not is_retriable(exc) else 0
        if self._refusals >= _REFUSED_TRANSACTIONS:
            raise Undeliverable(
                f"{self._refusals} transactions in a row refused ({exc!r}); stopping with their "
                "offsets uncommitted (check the reply and dead-letter topics' ACLs and size limits)"
            ) from exc

    async def _redo(self, ready: list[Ticket[Any]]) -> None:
        """After an aborted transaction: read again from the committed offsets, and drop its tickets and
        the held ones (their records come again)."""
        await self._rewinder.rewind()
        for ticket in [*ready, *self._held]:
            ticket.settle(None)
        self._held = []

    def _committed(
        self,
        ready: list[Ticket[Any]],
        built: list[tuple[Result, list[OutRecord]]],
        offsets: dict[TopicPartition, int],
    ) -> None:
        """The transaction committed: its offsets are the partitions' new floors, its tickets settle."""
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
