"""Records in: every polled record gets a ticket, is decoded at the edge, and is answered at once or
prepared by the engine and queued for a batch.

Each job is prepared on its own task in a small pool of CPU threads (prepare_pool.py) and joins the
batcher the moment its own prepare ends, so a record that takes seconds to tokenize delays nobody else's
job. Answers may therefore complete out of offset order; the watermark commits only what lies below the
oldest unanswered record. A prepare still running counts in the ledger, so draining and rebalances wait for
it like for any other job.

A job's deadline (deadline.py) is checked here twice: a job already expired when it is read is answered
`deadline_exceeded` without being prepared, and one that expired while it was being prepared is not
queued; the batcher checks the rest while they wait.

The next fetch waits until this poll's prepares are done, so their tokens count in the backpressure
budget before more is read (the budget is overrun by at most one poll), but at most `_PREPARE_WAIT_S`:
a record that takes longer to prepare goes on alone, without holding back the other partitions.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from kafka_scorer.kafka.records import RecordLike, TopicPartition
from kafka_scorer.wire.protocol import Result
from kafka_scorer.worker.batcher import Batcher
from kafka_scorer.worker.deadline import TimePolicy, born_at
from kafka_scorer.worker.engine import Engine
from kafka_scorer.worker.envelope import Inbound, RecordCodec
from kafka_scorer.worker.ledger import Ledger
from kafka_scorer.worker.outbox import Outbox
from kafka_scorer.worker.prepare_pool import PreparePool
from kafka_scorer.worker.ticket import Ticket
from kafka_scorer.worker.tracing import Tracing

log = logging.getLogger(__name__)

_PREPARE_THREADS = 4  # tokenizers release the GIL: one huge record holds one thread, not the others
_PREPARE_WAIT_S = 0.25  # longest a poll waits for its own prepares before the next fetch


class Intake:
    def __init__(
        self,
        engine: Engine[Any, Any],
        ledger: Ledger,
        batcher: Batcher[Any, Any],
        outbox: Outbox,
        codec: RecordCodec,
        tracing: Tracing,
        time_policy: TimePolicy | None = None,
    ) -> None:
        self.engine = engine
        self.ledger = ledger
        self.batcher = batcher
        self.outbox = outbox
        self.codec = codec
        self.tracing = tracing
        self.time_policy = time_policy or TimePolicy()
        self.pool = PreparePool(_PREPARE_THREADS, "kafka-scorer-prepare")

    async def accept(self, polled: Mapping[TopicPartition, Sequence[RecordLike]]) -> None:
        """Ticket, decode and answer-or-prepare every polled record."""
        answered: list[Ticket[Any]] = []
        preparing = self.pool.round()
        for tp, records in polled.items():
            for record in records:
                ticket, inbound = self._open(tp, record)
                if inbound is None:
                    answered.append(ticket)
                    continue
                preparing.submit(
                    functools.partial(self._prepare, ticket, inbound),
                    functools.partial(self._prepared, ticket),
                )
        self.outbox.send(answered)
        await preparing.wait(_PREPARE_WAIT_S)
        self.ledger.backpressure()

    def _open(self, tp: TopicPartition, record: RecordLike) -> tuple[Ticket[Any], Inbound | None]:
        """The record's ticket, and its job when it decodes (else the ticket carries its answer)."""
        try:
            decoded = self.codec.decode_record(record)
        except Exception as exc:  # catch-all, on purpose: the codec answers every bad input itself, so
            # this is a bug in it, and no record may stop the worker
            log.exception("reading record %s[%d]@%d failed", record.topic, record.partition, record.offset)
            job_id = f"{record.topic}:{record.partition}:{record.offset}"
            ticket = self.ledger.open(tp, self.codec.bare_origin(record), job_id)
            return ticket.fail("reading the record", exc), None
        job_id = decoded.job_id if isinstance(decoded, Inbound) else decoded.result.id
        trace = self.tracing.job(decoded.origin, job_id, self.codec.group_id)
        ticket = self.ledger.open(tp, decoded.origin, job_id, trace)
        if not isinstance(decoded, Inbound):
            return ticket.answer(decoded.result, decoded.dead_letter), None
        job, policy = decoded.job, self.time_policy
        ticket.items = len(job.inputs)
        ticket.born = born_at(record.timestamp)
        ticket.priority = policy.priority(record.topic, job.priority)
        ticket.deadline = policy.deadline(ticket.born, job.timeout_ms)
        now = time.monotonic()
        if ticket.expired(now):
            return ticket.expire(now), None
        return ticket, decoded

    def _prepare(self, ticket: Ticket[Any], inbound: Inbound) -> Any:
        """On a prepare thread: the engine's tokenization and validation of one job."""
        with ticket.trace.span("prepare"):
            return self.engine.prepare(inbound.job, inbound.job_id)

    def _prepared(self, ticket: Ticket[Any], prepared: Any, failure: BaseException | None) -> None:
        """On the event loop, as each prepare ends: the job joins the batcher, or its answer goes out."""
        if self.outbox.closing:
            return  # shutting down: nothing more is answered or committed
        stage = "prepare"
        try:
            if failure is not None:
                raise failure
            stage = "queueing the job"
            self._queue(ticket, prepared)
        except Exception as exc:  # catch-all, on purpose: the engine answers bad jobs itself, so this is
            # a bug in prepare or in queueing; a done-callback's exception would only be logged by the loop,
            # leaving the ticket unsettled and its partition's commits stuck behind it
            log.exception(
                "%s failed for job %s (%s); answered as internal", stage, ticket.job_id, ticket.where
            )
            self.outbox.send_soon(ticket.fail(stage, exc))

    def _queue(self, ticket: Ticket[Any], prepared: Any) -> None:
        now = time.monotonic()
        if isinstance(prepared, Result):
            self.outbox.send_soon(ticket.answer(prepared))
        elif ticket.watermark.closed:  # revoked while it was being prepared
            ticket.settle(None)
        elif ticket.expired(now):
            self.outbox.send_soon(ticket.expire(now))
        else:
            ticket.prepared = prepared
            self.ledger.queued(ticket, prepared.num_tokens)
            self.batcher.add(ticket)

    def close(self) -> None:
        self.pool.close()
