"""Partitions come and go: settle before they leave, restart their watermarks when their log moved.

- **Revoked** (a rebalance hands them to another member): answer and commit their in-flight work
  within `rebalance_grace_s`, then drop what is left, uncommitted, so the next owner scores it and
  nobody answers a job twice after the handover; queued jobs of those partitions are taken out of the
  batcher uncomputed.
- **Lost** with the group membership (the broker restarted, the session expired): dropped at once,
  uncommitted (kafka/consumer.py explains why no commit may follow); an exactly-once transaction in
  flight is waited for (it aborts: its membership is gone) before the member rejoins.
- **Assigned** (exactly-once): a partition this worker committed transactions for is positioned once the
  group's committed offset shows them (worker/transaction_fence.py), never below.
- **Reset** (the partition's log was reset under the worker) and **rewound** (exactly-once: an
  aborted transaction): the watermark restarts, so late answers to earlier records move no commit.

Closing a watermark is what drops work: every ticket of a closed watermark settles as dropped, wherever
it is (queued here, held by delivery, or finishing on the device later).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any, Protocol

from kafka_scorer.config import Settings
from kafka_scorer.kafka.errors import KafkaError
from kafka_scorer.kafka.log_reset import Verdicts
from kafka_scorer.kafka.records import TopicPartition
from kafka_scorer.worker.batcher import Batcher
from kafka_scorer.worker.ledger import Ledger
from kafka_scorer.worker.metrics import WorkerMetrics
from kafka_scorer.worker.outbox import Outbox
from kafka_scorer.worker.transaction_fence import VISIBLE_WAIT_S

log = logging.getLogger(__name__)


class Partitions(Protocol):
    """The consumer as a rebalance sees it."""

    @property
    def membership_lost(self) -> bool: ...

    def assignment(self) -> set[TopicPartition]: ...

    def pause(self, partitions: Iterable[TopicPartition] | None = None) -> None: ...

    def resume(self, partitions: Iterable[TopicPartition] | None = None) -> None: ...

    async def rewind(self, partitions: Iterable[TopicPartition]) -> None: ...

    async def seek_when_visible(
        self, floors: dict[TopicPartition, int], timeout_s: float
    ) -> dict[TopicPartition, int]: ...


class Rebalance:
    def __init__(
        self,
        settings: Settings,
        ledger: Ledger,
        batcher: Batcher[Any, Any],
        outbox: Outbox,
        metrics: WorkerMetrics,
        consumer: Partitions,
    ) -> None:
        self.grace_s = settings.rebalance_grace_s
        self.ledger = ledger
        self.batcher = batcher
        self.outbox = outbox
        self.metrics = metrics
        self.consumer = consumer

    async def on_assigned(self, assigned: set[TopicPartition]) -> None:
        self.ledger.tracker.assign(assigned)
        held = self.ledger.held(assigned)
        if held:
            self.consumer.pause(held)
        await self.after_own_commits(assigned)
        log.info("partitions assigned: %s", names(assigned))

    async def after_own_commits(self, partitions: set[TopicPartition]) -> None:
        """Exactly-once: position `partitions` at or past what this worker's transactions committed
        there, once the group shows it (a transaction in flight ends first). Nothing at at-least-once."""
        delivery = self.outbox.delivery
        if delivery is None or not partitions:
            return
        await delivery.settle_in_flight()
        floors = delivery.floors(sorted(partitions))
        if not floors:
            return
        # paused meanwhile: aiokafka fetches a new assignment from the group's (maybe stale) offset while
        # this waits, and records handed out from there would be answered a second time
        self.consumer.pause(floors)
        try:
            await self.consumer.seek_when_visible(floors, VISIBLE_WAIT_S)
        finally:
            self.consumer.resume(set(floors) - self.ledger.held(set(floors)))

    async def after_log_resets(self, verdicts: Verdicts[TopicPartition]) -> None:
        """After the consumer repositioned the partitions whose log was reset (kafka/log_reset.py): every
        verdict counted, the repositioned partitions' watermarks restarted, and (exactly-once) their
        positions never below what this worker's transactions committed."""
        for outcome, found in (
            ("repositioned", verdicts.reset),
            ("contradicted", verdicts.contradicted),
            ("refused", verdicts.refused),
        ):
            if found:
                self.metrics.log_resets.labels(outcome=outcome).inc(len(found))
        reset = set(verdicts.reset)
        self.restart(reset)
        self.consumer.resume(reset - self.ledger.held(reset))  # a failed poll's were paused meanwhile
        await self.after_own_commits(reset)

    async def on_revoked(self, revoked: set[TopicPartition]) -> None:
        if not revoked:
            return
        tracker = self.ledger.tracker
        if self.consumer.membership_lost and not self.outbox.closing:
            log.warning(
                "group membership lost (the broker restarted or the session expired): partitions %s "
                "dropped without a commit, %d in-flight jobs left to their next reader",
                names(revoked),
                tracker.unanswered(revoked),
            )
            self.restart(revoked, reassign=False)
            if self.outbox.delivery is not None:
                await self.outbox.delivery.settle_in_flight()  # before the rejoin reads committed offsets
            return
        if not self.outbox.closing:
            await self._settle(revoked)
        left = tracker.unanswered(revoked)
        tracker.revoke(revoked)
        self.settle_closed()
        log.info("partitions revoked: %s (%d in-flight jobs left to the next owner)", names(revoked), left)

    async def _settle(self, revoked: set[TopicPartition]) -> None:
        """Answer and commit the revoked partitions' work within the grace period."""
        self.batcher.drain()
        deadline = time.monotonic() + self.grace_s
        if self.outbox.failure is None:
            await self.ledger.settled(revoked, deadline)
        if self.outbox.delivery is not None:
            try:
                await self.outbox.delivery.commit(sorted(revoked))
            except KafkaError as exc:
                log.warning("commit of revoked partitions failed (%r); their next owner may repeat work", exc)
        if not self.ledger.draining:
            self.batcher.drain(False)

    def settle_closed(self) -> None:
        """Settle, as dropped, the work of partitions whose watermark just closed: held answers, and
        queued jobs, which are taken out of the batcher uncomputed (they are the next reader's now)."""
        if self.outbox.delivery is not None:
            self.outbox.delivery.discard_closed()
        dropped = self.batcher.discard(lambda ticket: ticket.watermark.closed)
        for ticket in dropped:
            ticket.settle(None)
        if dropped:
            log.info("%d queued jobs of closed partitions dropped before computing", len(dropped))

    def restart(self, partitions: set[TopicPartition], reassign: bool = True) -> None:
        """Close the partitions' watermarks (late answers to their in-flight records move no commit)."""
        if not partitions:
            return
        self.metrics.partition_resets.inc(len(partitions))
        self.ledger.tracker.revoke(partitions)
        if reassign:
            self.ledger.tracker.assign(partitions)
        self.settle_closed()

    async def rewind(self) -> None:
        """Exactly-once recovery: forget in-flight work and read again from the committed offsets."""
        partitions = self.consumer.assignment()
        self.ledger.tracker.revoke_all()
        self.ledger.tracker.assign(partitions)
        self.settle_closed()
        await self.consumer.rewind(partitions)


def names(partitions: Iterable[TopicPartition]) -> str:
    return ",".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(partitions)) or "-"
