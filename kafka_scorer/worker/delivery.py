"""Answer, then commit: the delivery rules of SPEC §7 in one place.

Every consumed record becomes a `Ticket`, and every ticket ends in exactly one `on_settled` call: either
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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

import msgspec
from aiokafka import TopicPartition
from aiokafka.errors import KafkaError, MessageSizeTooLargeError, RecordTooLargeError

from kafka_scorer.wire.protocol import ErrorCode, Result, error_result
from kafka_scorer.worker.logs import one_line
from kafka_scorer.worker.metrics import WorkerMetrics
from kafka_scorer.worker.offsets import OffsetTracker, Watermark
from kafka_scorer.worker.producer import FatalProducerError, Refused, ResultProducer
from kafka_scorer.worker.retry import Backoff, is_retriable
from kafka_scorer.worker.tracing import NO_SPANS, JobTrace
from kafka_scorer.worker.wire import Origin, OutRecord, result_record

log = logging.getLogger(__name__)

_TOO_LARGE = (MessageSizeTooLargeError, RecordTooLargeError)
_REFUSED_TRANSACTIONS = 3  # transactions refused in a row (not broker trouble) before the worker stops


class Undeliverable(FatalProducerError):
    """An answer that no topic will take: the worker stops without committing its record's offset."""


@dataclass(slots=True, eq=False)
class Ticket:
    """One consumed record on its way through the worker."""

    tp: TopicPartition
    origin: Origin
    job_id: str
    watermark: Watermark
    received_at: float
    items: int = 0
    tokens: int = 0
    enqueued_at: float = 0.0
    trace: JobTrace = NO_SPANS

    @property
    def offset(self) -> int:
        return self.origin.offset


def _where(ticket: Ticket) -> str:
    return f"{ticket.tp.topic}:{ticket.tp.partition}@{ticket.offset}"


def _reply_origin(ticket: Ticket, reply_topic: str | None = None) -> Origin:
    """The ticket's origin (its reply topic replaced if given) with the trace context its result
    carries: the `produce` span's where spans are recorded, else the job's own headers."""
    origin = ticket.origin if reply_topic is None else replace(ticket.origin, reply_topic=reply_topic)
    trace = ticket.trace.outgoing(origin.trace, origin.reply_topic)
    return origin if trace is origin.trace else replace(origin, trace=trace)


@dataclass(slots=True)
class Answer:
    ticket: Ticket
    result: Result
    dead_letter: OutRecord | None = None


Settled = Callable[[Ticket, Result | None], None]  # result None: dropped, not answered


class Delivery:
    """Shared parts: turning results into records that can actually be produced."""

    def __init__(
        self,
        producer: ResultProducer,
        tracker: OffsetTracker[TopicPartition],
        on_settled: Settled,
        metrics: WorkerMetrics,
        *,
        default_reply_topic: str,
        model_name: str,
        model_revision: str = "",
        dtype: str = "",
    ) -> None:
        self.producer = producer
        self.tracker = tracker
        self.on_settled = on_settled
        self.metrics = metrics
        self.default_reply_topic = default_reply_topic
        self.model_name = model_name
        self.model_revision = model_revision
        self.dtype = dtype

    def _stamped(self, result: Result) -> Result:
        """Provenance on every result (SPEC §8), also on those the worker answered without the engine
        (an undecodable record, a result too large to produce)."""
        if result.model_revision or not self.model_revision:
            return result
        return msgspec.structs.replace(
            result,
            model=result.model or self.model_name,
            model_revision=self.model_revision,
            dtype=self.dtype,
        )

    def _records(self, answer: Answer) -> tuple[Result, list[OutRecord]]:
        """The answer's records; a result too large to produce becomes a `too_long` error result."""
        result = self._stamped(answer.result)
        origin = _reply_origin(answer.ticket)
        record = result_record(result, origin)
        if not self.producer.fits(record):
            size = len(record.value or b"")
            result = error_result(
                result.id,
                ErrorCode.TOO_LONG,
                f"result is {size} bytes, over the producer limit of {self.producer.max_request_size} bytes "
                f"(max_message_bytes + 1 MiB); ask for fewer items or no pooled hidden states",
                model=self.model_name,
            )
            record = result_record(self._stamped(result), origin)
        records = [record]
        dead = answer.dead_letter
        if dead is not None:
            if self.producer.fits(dead):
                records.insert(0, dead)
            else:
                log.error(
                    "dead-letter copy of %s:%d is too large to produce; skipped",
                    dead.topic,
                    answer.ticket.offset,
                )
        return result, records

    def _dead_lettered(self, answer: Answer, record: OutRecord) -> None:
        """Count the copy and say so in one line: the record is out of the request topic's way now."""
        self.metrics.dead_letters.inc()
        error = answer.result.error
        log.warning(
            "dead-lettered %s to %s (job %s): %s",
            _where(answer.ticket),
            record.topic,
            answer.result.id,
            one_line(error.message) if error is not None else "-",
            extra={"job_id": answer.result.id, "dead_letter_topic": record.topic},
        )

    def _drop_closed(self, answers: Sequence[Answer]) -> list[Answer]:
        live = []
        for answer in answers:
            if answer.ticket.watermark.closed:
                self.on_settled(answer.ticket, None)
            else:
                live.append(answer)
        return live

    def _fallback(self, answer: Answer, record: OutRecord, refused: Refused) -> tuple[Result, OutRecord]:
        """What to send instead of a record the broker refused for good: an error result on the default
        reply topic where that can help; otherwise `Undeliverable`, leaving the ticket unanswered.

        Never "log and move on": the offset would be committed with no answer anywhere, which breaks
        at-least-once (SPEC §7). Stopping instead leaves the record uncommitted for the next worker, and
        the operator one line naming the topic and the setting to fix.
        """
        where = _where(answer.ticket)
        if record is answer.dead_letter:
            raise Undeliverable(
                f"cannot copy {where} to the dead-letter topic {record.topic!r} ({refused.cause!r}); "
                "create it or grant this worker write access (setting: dead_letter_topic)"
            ) from refused
        too_large = isinstance(refused.cause, _TOO_LARGE)
        if record.topic == self.default_reply_topic and not too_large:
            raise Undeliverable(
                f"cannot answer {where} (job {answer.result.id}) on the reply topic {record.topic!r} "
                f"({refused.cause!r}); create it or grant this worker write access (setting: reply_topic)"
            ) from refused
        code, why = (
            (ErrorCode.TOO_LONG, "is over the topic's size limit")
            if too_large
            else (ErrorCode.INVALID_REQUEST, "refused it")
        )
        result = error_result(
            answer.result.id,
            code,
            f"cannot produce the result to reply topic {record.topic!r}: "
            f"the broker {why} ({refused.cause!r})",
            model=self.model_name,
        )
        result = self._stamped(result)
        return result, result_record(result, _reply_origin(answer.ticket, self.default_reply_topic))

    async def deliver(self, answers: Sequence[Answer]) -> None:
        raise NotImplementedError

    async def commit(self, partitions: Sequence[TopicPartition] | None = None) -> None:
        """Commit what is committable now (at-least-once); transactions commit as they go."""

    def discard_closed(self) -> None:
        """Settle, as dropped, answers still held for partitions that were just revoked."""

    async def run(self) -> None:
        """Background work (the committer); returns only when cancelled."""
        await asyncio.Event().wait()


class AtLeastOnceDelivery(Delivery):
    def __init__(
        self,
        producer: ResultProducer,
        tracker: OffsetTracker[TopicPartition],
        on_settled: Settled,
        metrics: WorkerMetrics,
        commit_offsets: Callable[[dict[TopicPartition, int]], Awaitable[dict[TopicPartition, int]]],
        *,
        default_reply_topic: str,
        model_name: str,
        model_revision: str = "",
        dtype: str = "",
    ) -> None:
        super().__init__(
            producer,
            tracker,
            on_settled,
            metrics,
            default_reply_topic=default_reply_topic,
            model_name=model_name,
            model_revision=model_revision,
            dtype=dtype,
        )
        self._commit_offsets = commit_offsets
        self._commit_lock = asyncio.Lock()
        self._poke = asyncio.Event()

    async def deliver(self, answers: Sequence[Answer]) -> None:
        await asyncio.gather(*(self._answer(a) for a in self._drop_closed(answers)))

    async def _answer(self, answer: Answer) -> None:
        result, records = self._records(answer)
        for record in records:
            try:
                await self.producer.send(record)
            except Refused as exc:
                result = await self._answer_elsewhere(answer, record, exc)
            else:
                if record is answer.dead_letter:
                    self._dead_lettered(answer, record)
        if answer.ticket.watermark.answered(answer.ticket.offset):
            self.on_settled(answer.ticket, result)
            self._poke.set()
        else:
            self.on_settled(answer.ticket, None)

    async def _answer_elsewhere(self, answer: Answer, record: OutRecord, refused: Refused) -> Result:
        """Send the fallback for a refused record; a fallback refused too is `Undeliverable`."""
        result, moved = self._fallback(answer, record, refused)
        try:
            await self.producer.send(moved)
        except Refused as exc:
            raise Undeliverable(
                f"cannot answer {_where(answer.ticket)} (job {answer.result.id}) on {record.topic!r} "
                f"({refused.cause!r}) nor on the reply topic {moved.topic!r} ({exc.cause!r}) "
                "(setting: reply_topic)"
            ) from exc
        log.warning(
            "%s refused the result of %s (%r); answered on %s",
            record.topic,
            _where(answer.ticket),
            refused,
            moved.topic,
        )
        return result

    async def commit(self, partitions: Sequence[TopicPartition] | None = None) -> None:
        async with self._commit_lock:
            offsets = self.tracker.to_commit(partitions)
            if not offsets:
                return
            self.tracker.committed(await self._commit_offsets(offsets))

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
        on_settled: Settled,
        metrics: WorkerMetrics,
        rewind: Callable[[], Awaitable[None]],
        *,
        group_id: str,
        default_reply_topic: str,
        model_name: str,
        model_revision: str = "",
        dtype: str = "",
        committable: Callable[[dict[TopicPartition, int]], dict[TopicPartition, int]] = dict,
    ) -> None:
        super().__init__(
            producer,
            tracker,
            on_settled,
            metrics,
            default_reply_topic=default_reply_topic,
            model_name=model_name,
            model_revision=model_revision,
            dtype=dtype,
        )
        self._rewind = rewind
        self._group_id = group_id
        self._committable = committable  # the consumer's guards: membership held, within the log end
        self._txn_lock = asyncio.Lock()
        self._backoff = Backoff()
        self._held: list[Answer] = []  # answered, waiting for an older record of the same partition
        self._refusals = 0  # transactions refused (not merely failed) in a row

    async def deliver(self, answers: Sequence[Answer]) -> None:
        """Commit, in one transaction, every answer its partition's watermark has now passed.

        An answer that overtook an older record of its partition is held back (not produced) until
        that record is answered too: a transaction may only carry results whose offsets it commits,
        or a crash would make the next owner produce them again, visibly, in another transaction.
        """
        async with self._txn_lock:
            for answer in self._drop_closed(answers):
                answer.ticket.watermark.answered(answer.ticket.offset)
                self._held.append(answer)
            ready: list[Answer] = []
            held: list[Answer] = []
            for answer in self._held:
                mark = answer.ticket.watermark
                passed = mark.commit_offset()
                if mark.closed:
                    self.on_settled(answer.ticket, None)
                elif passed is not None and answer.ticket.offset < passed:
                    ready.append(answer)
                else:
                    held.append(answer)
            self._held = held
            offsets = self.tracker.to_commit()
            ready, offsets = self._within_guards(ready, offsets)
            if not ready:
                return
            built = [await self._producible(a) for a in ready]
            records = [r for _, recs in built for r in recs]
            try:
                await self.producer.send_transaction(records, offsets, self._group_id)
            except FatalProducerError:
                raise
            except Exception as exc:
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
                await self._rewind()
                for answer in [*ready, *self._held]:
                    self.on_settled(answer.ticket, None)
                self._held = []
                await self._backoff.sleep()
                return
            self._backoff.reset()
            self._refusals = 0
            self.tracker.committed(offsets)
            for answer, (result, records) in zip(ready, built, strict=True):
                if answer.dead_letter is not None and answer.dead_letter in records:
                    self._dead_lettered(answer, answer.dead_letter)
                self.on_settled(answer.ticket, result)

    def _within_guards(
        self, ready: list[Answer], offsets: dict[TopicPartition, int]
    ) -> tuple[list[Answer], dict[TopicPartition, int]]:
        """Drop the answers of partitions whose offsets may not be committed now (membership lost, or a
        log reset): a transaction must not carry results whose offsets it cannot commit."""
        allowed = self._committable(offsets)
        if allowed == offsets:
            return ready, offsets
        keep = []
        for answer in ready:
            if answer.ticket.tp in allowed:
                keep.append(answer)
            else:
                self.on_settled(answer.ticket, None)
        return keep, allowed

    async def _producible(self, answer: Answer) -> tuple[Result, list[OutRecord]]:
        """The answer's records, each bound for a topic the broker has and lets us write: one refused
        record would abort its whole transaction, and the redo would be refused again, for ever."""
        result, records = self._records(answer)
        out = []
        for record in records:
            try:
                await self.producer.ensure_topic(record.topic)
            except Refused as exc:
                result, record = self._fallback(answer, record, exc)
                try:
                    await self.producer.ensure_topic(record.topic)
                except Refused as again:
                    raise Undeliverable(
                        f"cannot answer {_where(answer.ticket)} on {record.topic!r} either ({again.cause!r}) "
                        "(setting: reply_topic)"
                    ) from again
            out.append(record)
        return result, out

    async def commit(self, partitions: Sequence[TopicPartition] | None = None) -> None:
        async with self._txn_lock:  # wait for a transaction in flight: its offsets are the commit
            return

    def discard_closed(self) -> None:
        keep = []
        for answer in self._held:
            if answer.ticket.watermark.closed:
                self.on_settled(answer.ticket, None)
            else:
                keep.append(answer)
        self._held = keep
