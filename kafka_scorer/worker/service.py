"""The worker: records in, jobs batched onto the engine, results out, offsets committed; and its lifecycle.

A record's path, top to bottom:
1. `_accept`: each polled record gets a `Ticket` (its offset joins the partition's watermark) and is
   decoded at the edge (wire.py). Undecodable or oversized records are answered at once.
2. Decoded jobs are tokenized and validated by `Scorer.prepare`, each on its own task in a small pool
   of CPU threads; invalid ones are answered at once, the rest go to the `Batcher` as each prepare ends.
3. The batcher runs a forward pass on the device thread; `_on_batch_done` hands the results to delivery.
4. Delivery produces the answers and moves the watermarks; every ticket ends in `_on_settled`, which
   releases its in-flight tokens and lifts backpressure.

Lifecycle: `run(stop)` serves until `stop` is set, then stops fetching, answers and commits what is in
flight within `shutdown_grace_s`, and closes. Broker outages are retried inside the consumer, producer
and committer; only what is really fatal ends `run` early (exit code 1), without committing anything
unanswered: a fenced producer, an answer no topic takes, a device error that poisons the process
(engine/failures.py), or a bug in the worker itself. The probes turn red at once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import time
from collections.abc import Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from kafka_scorer import __version__
from kafka_scorer.config import Settings
from kafka_scorer.protocol import ErrorCode, Job, Result, error_result
from kafka_scorer.worker.batcher import BatchDone, Batcher
from kafka_scorer.worker.consumer import JobConsumer
from kafka_scorer.worker.delivery import Answer, AtLeastOnceDelivery, Delivery, ExactlyOnceDelivery, Ticket
from kafka_scorer.worker.logs import one_line
from kafka_scorer.worker.metrics import ProbeServer, WorkerMetrics
from kafka_scorer.worker.offsets import OffsetTracker
from kafka_scorer.worker.producer import ResultProducer
from kafka_scorer.worker.topic_watch import TopicWatch
from kafka_scorer.worker.tracing import JobTrace, Tracing, from_environment
from kafka_scorer.worker.wire import Inbound, RecordLike, Rejected, WireRules, internal_rejection, read_record

log = logging.getLogger(__name__)

_POLL_MS = 100  # longest the loop sits in one poll, so a stop request is seen quickly
_PREPARE_THREADS = 4  # tokenizers release the GIL: one huge record holds one thread, not the others
_PREPARE_WAIT_S = 0.25  # longest a poll waits for its own prepares before the next fetch (see _accept)
_RECORDS_PER_POLL_IN_FLIGHT = (
    4  # in-flight records cap, in polls' worth (bounds answers not counted in tokens)
)
# Error results the client caused (its job or record) log at INFO; the rest are the worker's to fix.
_CLIENT_ERRORS = frozenset(
    {
        ErrorCode.INVALID_MESSAGE,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.TOO_LONG,
        ErrorCode.UNSUPPORTED,
        ErrorCode.MODEL_MISMATCH,
    }
)


class ScorerLike(Protocol):
    """The engine seam (kafka_scorer.engine.scorer.Scorer)."""

    @property
    def model_name(self) -> str: ...

    def prepare(self, job: Job, job_id: str) -> Any: ...

    def pack(self, jobs: Sequence[Any]) -> Any: ...

    def run_packed(self, packed: Any) -> list[Result]: ...


def default_transactional_id(settings: Settings) -> str:
    return settings.transactional_id or f"{settings.group_id}.{settings.client_id}.{socket.gethostname()}"


class Worker:
    def __init__(
        self,
        settings: Settings,
        scorer: ScorerLike,
        metrics: WorkerMetrics | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.settings = settings
        self.scorer = scorer
        self.metrics = metrics or WorkerMetrics()
        self.tracing = tracing if tracing is not None else from_environment()
        self.tracker: OffsetTracker[TopicPartition] = OffsetTracker()
        self.consumer = JobConsumer(settings, self._on_revoked, self._on_assigned)
        self.topic_watch = TopicWatch(settings, self.consumer.cluster_partitions)
        txn_id = default_transactional_id(settings) if settings.delivery == "exactly_once" else None
        self.producer = ResultProducer(settings, transactional_id=txn_id)
        self.batcher: Batcher[Ticket] = Batcher(
            scorer,
            self._on_batch_done,
            max_batch_tokens=settings.max_batch_tokens,
            max_batch_wait_ms=settings.max_batch_wait_ms,
        )
        self.rules = WireRules(
            reply_topic=settings.reply_topic,
            dead_letter_topic_for=settings.dead_letter_topic_for,
            max_message_bytes=settings.max_message_bytes,
            model_name=scorer.model_name,
            group_id=settings.group_id,
            max_header_bytes=settings.max_header_bytes,
        )
        self.delivery: Delivery | None = None
        self._prepare_pool = ThreadPoolExecutor(_PREPARE_THREADS, thread_name_prefix="kafka-scorer-prepare")
        self._prepared_answers: list[Answer] = []  # prepare errors finished in this loop turn, sent together
        self._deliveries: set[asyncio.Task[None]] = set()
        self._settled = asyncio.Event()
        self._max_inflight_jobs = _RECORDS_PER_POLL_IN_FLIGHT * settings.max_poll_records
        self.inflight_tokens = 0
        self.inflight_jobs = 0
        self.peak_inflight_tokens = 0  # high-water marks: what backpressure actually allowed
        self.peak_inflight_jobs = 0
        self.resumes = 0
        self._paused = False
        self._draining = False
        self._closing = False
        self._started = False
        self._fatal: BaseException | None = None

    # ---- lifecycle -------------------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        """False once the worker can no longer score: a fatal error, or a device the batcher gave up on."""
        return self._fatal is None and self.batcher.failure is None

    @property
    def ready(self) -> bool:
        return self._started and not self._draining and self.healthy and self.topic_watch.ready

    async def run(self, stop: asyncio.Event) -> int:
        """Serve until `stop` is set; 0 after a clean drain, 1 after a fatal error."""
        probe = None
        if self.settings.metrics_port:
            probe = ProbeServer(
                self.metrics,
                lambda: self.ready,
                self.settings.metrics_host,
                self.settings.metrics_port,
                healthy=lambda: self.healthy,
            )
            await probe.start()
        background: list[asyncio.Task[None]] = []
        try:
            # Both retry while the cluster is unreachable; a signal meanwhile ends the start-up cleanly.
            if not await _unless_stopped(self.producer.start(), stop):
                return 0
            self.delivery = self._make_delivery()
            if not await _unless_stopped(self.consumer.start(), stop):
                return 0
            background = [
                asyncio.create_task(self.batcher.run(), name="batcher"),
                asyncio.create_task(self.delivery.run(), name="committer"),
                asyncio.create_task(self.topic_watch.run(stop), name="topic-watch"),
            ]
            self._started = True
            served = dict(getattr(self.scorer, "description", {"model": self.scorer.model_name}))
            self.metrics.describe(__version__, served)
            log.info("serving %s", " ".join(f"{key}={value}" for key, value in served.items()))
            log.info(
                "worker ready: model=%s topics=%s group=%s delivery=%s producer=%s",
                self.scorer.model_name,
                self.settings.request_topic_pattern or ",".join(self.settings.request_topics),
                self.settings.group_id,
                "exactly_once" if isinstance(self.delivery, ExactlyOnceDelivery) else "at_least_once",
                self.producer.mode,
            )
            while not stop.is_set() and self._fatal is None:
                self._check(background)
                records = await self.consumer.fetch(_POLL_MS, self.settings.max_poll_records)
                self.metrics.set_lag(self.consumer.lag(self.tracker.committed_offsets()))
                if records:
                    await self._accept(records)
                self._restart_watermarks(await self.consumer.reposition_reset_logs())
            self._check(background)  # a fault that came with the stop request still makes the exit fatal
            if self._fatal is None:
                await self._drain()
                self._check(background)
        except Exception as exc:
            log.exception("worker failed")
            self._fatal = self._fatal or exc
        finally:
            self._closing = True
            self._draining = True
            for task in [*background, *self._deliveries]:
                task.cancel()
            await asyncio.gather(*background, *self._deliveries, return_exceptions=True)
            await self.consumer.stop()
            await self.producer.stop()
            self.batcher.close()
            self._prepare_pool.shutdown(wait=False, cancel_futures=True)
            self.tracing.close()
            if probe is not None:
                await probe.stop()
        if self._fatal is not None:
            log.error("worker stopped after a fatal error: %r", self._fatal)
            return 1
        log.info("worker stopped cleanly")
        return 0

    def _make_delivery(self) -> Delivery:
        common = {
            "default_reply_topic": self.settings.reply_topic,
            "model_name": self.scorer.model_name,
            "model_revision": getattr(self.scorer, "revision", ""),
            "dtype": getattr(self.scorer, "dtype_name", ""),
        }
        if self.producer.transactional:
            return ExactlyOnceDelivery(
                self.producer,
                self.tracker,
                self._on_settled,
                self.metrics,
                self._rewind,
                group_id=self.settings.group_id,
                committable=self.consumer.committable,
                **common,
            )
        return AtLeastOnceDelivery(
            self.producer, self.tracker, self._on_settled, self.metrics, self.consumer.commit, **common
        )

    def _check(self, background: list[asyncio.Task[None]]) -> None:
        """Raise what ended a background task (a device error from the batcher, a bug): fatal."""
        if self.batcher.failure is not None:
            raise self.batcher.failure
        for task in background:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    async def _drain(self) -> None:
        """Stop fetching; answer and commit everything in flight, within the grace period."""
        self._draining = True
        self.consumer.pause()
        self.batcher.drain()
        grace = self.settings.shutdown_grace_s
        deadline = time.monotonic() + grace
        log.info("stopping: %d jobs in flight, %.1fs grace", self.inflight_jobs, grace)
        while self.inflight_jobs and time.monotonic() < deadline and self.healthy:
            # Keep polling (all partitions paused) so the group membership stays alive meanwhile.
            records = await self.consumer.fetch(20, self.settings.max_poll_records)
            if records:
                await self._accept(records)
        assert self.delivery is not None
        try:
            await asyncio.wait_for(self.delivery.commit(), max(0.1, deadline - time.monotonic()))
        except (KafkaError, TimeoutError) as exc:
            log.error("final commit failed (%r): the uncommitted jobs will be scored again", exc)
        if self.inflight_jobs:
            log.warning(
                "grace period over: %d jobs unanswered and uncommitted; their next reader redoes them",
                self.inflight_jobs,
            )

    # ---- records in ------------------------------------------------------------------------------

    async def _accept(self, polled: Mapping[TopicPartition, Sequence[RecordLike]]) -> None:
        """Ticket, decode and answer-or-prepare every polled record.

        Each job is prepared on its own task in the prepare pool and joins the batcher the moment its
        own prepare ends, so a record that takes seconds to tokenize delays nobody else's job. Answers
        may therefore complete out of offset order; the watermark commits only what lies below the
        oldest unanswered record. A prepare still running counts in `inflight_jobs`, so draining and
        rebalances wait for it like for any other job.

        The next fetch waits until this poll's prepares are done, so their tokens count in the
        backpressure budget before more is read (the budget is overrun by at most one poll) — but at
        most `_PREPARE_WAIT_S`: a record that takes longer to prepare goes on alone, without holding
        back the other partitions' records.
        """
        now = time.monotonic()
        answers: list[Answer] = []
        preparing: list[asyncio.Future[Any]] = []
        for tp, records in polled.items():
            mark = self.tracker.watermark(tp)
            for record in records:
                try:
                    mark.received(record.offset)
                except ValueError:  # the position moved back (a seek): older in-flight work is moot
                    log.warning("%s went back to offset %d; restarting its watermark", tp, record.offset)
                    self.tracker.revoke([tp])
                    mark = self.tracker.watermark(tp)
                    mark.received(record.offset)
                decoded = self._read(record)
                job_id = decoded.job_id if isinstance(decoded, Inbound) else decoded.result.id
                ticket = Ticket(tp=tp, origin=decoded.origin, job_id=job_id, watermark=mark, received_at=now)
                ticket.trace = self.tracing.job(decoded.origin, job_id, self.settings.group_id)
                self.inflight_jobs += 1
                self.peak_inflight_jobs = max(self.peak_inflight_jobs, self.inflight_jobs)
                if isinstance(decoded, Inbound):
                    ticket.items = len(decoded.job.items)
                    future = asyncio.wrap_future(
                        self._prepare_pool.submit(self._prepare_one, decoded, ticket.trace)
                    )
                    future.add_done_callback(functools.partial(self._on_prepared, ticket))
                    preparing.append(future)
                else:
                    answers.append(Answer(ticket, decoded.result, decoded.dead_letter))
        if answers:
            self._spawn(answers)
        if preparing:
            await asyncio.wait(preparing, timeout=_PREPARE_WAIT_S)
        self._backpressure()

    def _read(self, record: RecordLike) -> Inbound | Rejected:
        """`read_record` never raises for bad input; should it raise anyway (a bug), the record gets an
        `internal` answer and the worker goes on: no record may stop the worker."""
        try:
            return read_record(record, self.rules)
        except Exception as exc:
            log.exception(
                "reading record %s[%d]@%d failed; answered as internal",
                record.topic,
                record.partition,
                record.offset,
            )
            return internal_rejection(record, self.rules, exc)

    def _prepare_one(self, inbound: Inbound, trace: JobTrace) -> Any:
        """On a prepare thread: tokenization and validation of one job; never raises."""
        try:
            with trace.span("prepare"):
                return self.scorer.prepare(inbound.job, inbound.job_id)
        except Exception as exc:
            origin = inbound.origin
            log.exception(
                "prepare failed for job %s (%s[%d]@%d)",
                inbound.job_id,
                origin.topic,
                origin.partition,
                origin.offset,
            )
            message = f"prepare failed: {type(exc).__name__}: {exc}"
            return error_result(inbound.job_id, ErrorCode.INTERNAL, message, model=self.scorer.model_name)

    def _on_prepared(self, ticket: Ticket, future: asyncio.Future[Any]) -> None:
        """On the event loop, as each prepare ends: the job joins the batcher, or its error is answered.

        A done-callback's exception would only be logged by the loop, leaving the ticket unsettled and
        its partition's commits stuck behind it; so anything raised here answers the job instead.
        """
        if self._closing or future.cancelled():
            return  # shutting down: nothing more is answered or committed
        try:
            item = future.result()
            if isinstance(item, Result):
                self._answer_prepared(ticket, item)
            elif ticket.watermark.closed:  # revoked while it was being prepared
                self._on_settled(ticket, None)
            else:
                ticket.tokens = item.num_tokens
                ticket.enqueued_at = time.monotonic()
                self.inflight_tokens += ticket.tokens
                self.peak_inflight_tokens = max(self.peak_inflight_tokens, self.inflight_tokens)
                self.batcher.add(item, ticket)
                self._backpressure()
        except Exception as exc:
            log.exception("queueing job %s failed; answered as internal", ticket.job_id)
            message = f"queueing the job failed: {type(exc).__name__}: {exc}"
            self._answer_prepared(
                ticket, error_result(ticket.job_id, ErrorCode.INTERNAL, message, model=self.scorer.model_name)
            )

    def _answer_prepared(self, ticket: Ticket, result: Result) -> None:
        if not self._prepared_answers:  # the first this turn: send them all once the turn ends
            asyncio.get_running_loop().call_soon(self._flush_prepared_answers)
        self._prepared_answers.append(Answer(ticket, result))

    def _flush_prepared_answers(self) -> None:
        """Errors found by prepare go out together (one transaction in exactly-once mode, not one each)."""
        answers, self._prepared_answers = self._prepared_answers, []
        if answers and not self._closing:
            self._spawn(answers)

    # ---- results out -----------------------------------------------------------------------------

    def _on_batch_done(self, done: BatchDone[Ticket]) -> None:
        m = self.metrics
        compute_ms = done.compute_s * 1000
        queue_ms = max(done.queue_s) * 1000 if done.queue_s else 0.0
        items = sum(t.items for t in done.contexts)
        m.batches.inc()
        m.batch_jobs.observe(len(done.contexts))
        m.batch_items.observe(items)
        m.batch_tokens.observe(done.tokens)
        m.tokens.inc(done.tokens)
        m.compute_seconds.observe(done.compute_s)
        for q in done.queue_s:
            m.queue_seconds.observe(q)
        log.info(
            "batch jobs=%d items=%d tokens=%d queue_ms=%.1f compute_ms=%.1f",
            len(done.contexts),
            items,
            done.tokens,
            queue_ms,
            compute_ms,
            extra={
                "jobs": len(done.contexts),
                "items": items,
                "tokens": done.tokens,
                "compute_ms": compute_ms,
            },
        )
        self._trace_batch(done, items)
        self._spawn([Answer(t, r) for t, r in zip(done.contexts, done.results, strict=True)])

    def _trace_batch(self, done: BatchDone[Ticket], items: int) -> None:
        """The batch and forward spans, after the fact: the batch formed when its oldest job was queued,
        and its forward pass started when every job's queue wait ended."""
        if not done.contexts:
            return
        first = done.contexts[0]
        started_at = first.enqueued_at + done.queue_s[0]
        self.tracing.batch(
            [ticket.trace for ticket in done.contexts],
            formed_at=min(ticket.enqueued_at for ticket in done.contexts),
            started_at=started_at,
            done_at=started_at + done.compute_s,
            attributes={"jobs": len(done.contexts), "items": items, "tokens": done.tokens},
        )

    def _spawn(self, answers: list[Answer]) -> None:
        assert self.delivery is not None
        task = asyncio.create_task(self._deliver(self.delivery.deliver(answers)))
        self._deliveries.add(task)
        task.add_done_callback(self._deliveries.discard)

    async def _deliver(self, coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # fenced producer, or a bug: stop rather than hang with unsettled work
            log.exception("delivery failed")
            self._fatal = self._fatal or exc

    def _on_settled(self, ticket: Ticket, result: Result | None) -> None:
        ticket.trace.end(result)
        self.inflight_jobs -= 1
        self.inflight_tokens -= ticket.tokens
        m = self.metrics
        if result is None:
            m.dropped.inc()
        else:
            m.jobs.inc()
            m.e2e_seconds.observe(time.monotonic() - ticket.received_at)
            if result.error is not None:
                m.errors.labels(code=result.error.code.value).inc()
                _log_error_result(ticket, result)
            elif result.scores is not None:
                m.items.inc(len(result.scores))
        self._settled.set()
        self._backpressure()

    # ---- backpressure and rebalances -------------------------------------------------------------

    def _backpressure(self) -> None:
        """Pause above the in-flight budget, resume below half of it (hysteresis avoids flapping)."""
        limit = self.settings.max_inflight_tokens
        over = self.inflight_tokens > limit or self.inflight_jobs > self._max_inflight_jobs
        under = self.inflight_tokens <= limit // 2 and self.inflight_jobs <= self._max_inflight_jobs // 2
        if not self._paused and over:
            self._paused = True
            self.consumer.pause()
            self.metrics.pauses.inc()
            log.debug(
                "backpressure: paused (%d tokens, %d jobs in flight)",
                self.inflight_tokens,
                self.inflight_jobs,
            )
        elif self._paused and under:
            self._paused = False
            self.resumes += 1
            if not self._draining:
                self.consumer.resume()
            log.info("backpressure: resumed (%d tokens in flight)", self.inflight_tokens)
        self.metrics.inflight_tokens.set(self.inflight_tokens)
        self.metrics.inflight_jobs.set(self.inflight_jobs)
        self.metrics.paused_partitions.set(len(self.consumer.paused()) if self._started else 0)
        self.metrics.queued_tokens.set(self.batcher.queued_tokens)

    async def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        self.tracker.assign(assigned)
        if self._paused or self._draining:
            self.consumer.pause(assigned)
        log.info("partitions assigned: %s", _names(assigned))

    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        """Settle before the partitions go: answer and commit their in-flight work, or drop it.

        Work still unanswered after `rebalance_grace_s` is dropped uncommitted (its late results are
        discarded), so the next owner scores it and nobody answers a job twice after the handover.
        Partitions *lost* with the group membership are dropped at once, uncommitted (consumer.py).
        """
        if not revoked:
            return
        if self.consumer.membership_lost and not self._closing:
            log.warning(
                "group membership lost (the broker restarted or the session expired): partitions %s "
                "dropped without a commit, %d in-flight jobs left to their next reader",
                _names(revoked),
                self.tracker.unanswered(revoked),
            )
            self._restart_watermarks(revoked, reassign=False)
            return
        if not self._closing:
            self.batcher.drain()
            deadline = time.monotonic() + self.settings.rebalance_grace_s
            while self.tracker.unanswered(revoked) and time.monotonic() < deadline and self._fatal is None:
                self._settled.clear()
                try:
                    await asyncio.wait_for(self._settled.wait(), max(0.001, deadline - time.monotonic()))
                except TimeoutError:
                    break
            if self.delivery is not None:
                try:
                    await self.delivery.commit(sorted(revoked))
                except KafkaError as exc:
                    log.warning(
                        "commit of revoked partitions failed (%r); their next owner may repeat work", exc
                    )
            if not self._draining:
                self.batcher.drain(False)
        left = self.tracker.unanswered(revoked)
        self.tracker.revoke(revoked)
        self._settle_closed()
        log.info("partitions revoked: %s (%d in-flight jobs left to the next owner)", _names(revoked), left)

    def _settle_closed(self) -> None:
        """Settle, as dropped, the work of partitions whose watermark just closed: held answers, and
        queued jobs, which are taken out of the batcher uncomputed (they are the next reader's now)."""
        if self.delivery is not None:
            self.delivery.discard_closed()
        dropped = self.batcher.discard(lambda ticket: ticket.watermark.closed)
        for ticket in dropped:
            self._on_settled(ticket, None)
        if dropped:
            log.info("%d queued jobs of closed partitions dropped before computing", len(dropped))

    def _restart_watermarks(self, partitions: set[TopicPartition], reassign: bool = True) -> None:
        """Close the partitions' watermarks (late answers to their in-flight records move no commit)."""
        if not partitions:
            return
        self.metrics.partition_resets.inc(len(partitions))
        self.tracker.revoke(partitions)
        if reassign:
            self.tracker.assign(partitions)
        self._settle_closed()

    async def _rewind(self) -> None:
        """Exactly-once recovery: forget in-flight work and read again from the committed offsets."""
        partitions = self.consumer.assignment()
        self.tracker.revoke_all()
        self.tracker.assign(partitions)
        self._settle_closed()
        await self.consumer.rewind(partitions)


async def _unless_stopped(start: Coroutine[Any, Any, None], stop: asyncio.Event) -> bool:
    """Run `start` unless `stop` is set first (then cancel it): False when stopped."""
    task = asyncio.ensure_future(start)
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if task.done():
        task.result()
        return True
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    log.info("stopped during start-up")
    return False


def _log_error_result(ticket: Ticket, result: Result) -> None:
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


def _names(partitions: set[TopicPartition]) -> str:
    return ",".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(partitions)) or "-"
