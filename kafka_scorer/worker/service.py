"""The worker: wiring, and the loop that serves until told to stop.

A record's path, one file each:
1. `kafka/consumer.py` fetches; `intake.py` opens a `Ticket` per record in the `ledger.py` (its offset joins
   the partition's watermark), decodes it at the edge (`envelope.py`) and has the engine prepare it on a
   CPU thread; a record answered without the engine goes straight out.
2. `batcher.py` queues prepared tickets, closes batches by the token budget and runs them on the device
   thread, writing each ticket's answer onto it; `batch_report.py` records the batch.
3. `outbox.py` hands answered tickets to `delivery.py`, which produces them and moves the watermarks
   (at-least-once; `exactly_once.py` with transactions); every ticket ends in `Ticket.settle`, which the
   ledger counts (backpressure lifts as tickets settle).
4. `rebalance.py` settles work before partitions leave and restarts watermarks when a log was reset.

Lifecycle: `run(stop)` serves until `stop` is set, then stops fetching, answers and commits what is in
flight within `shutdown_grace_s`, and closes. Broker outages are retried inside the consumer, producer
and committer; only a `FatalError` (a fenced producer, an answer no topic takes, a device error that
poisons the process) or a bug in the worker itself ends `run` early (exit code 1), without committing
anything unanswered. The probes turn red at once.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Coroutine
from typing import Any

from kafka_scorer import __version__
from kafka_scorer.config import Settings
from kafka_scorer.errors import FatalError
from kafka_scorer.kafka.consumer import JobConsumer
from kafka_scorer.kafka.errors import KafkaError
from kafka_scorer.kafka.group_model import OneModelAssignor
from kafka_scorer.kafka.outage import BrokerWatch
from kafka_scorer.kafka.producer import ResultProducer
from kafka_scorer.kafka.topic_watch import TopicWatch
from kafka_scorer.worker.batch_report import report_batch
from kafka_scorer.worker.batcher import BatchDone, Batcher
from kafka_scorer.worker.deadline import TimePolicy
from kafka_scorer.worker.delivery import AtLeastOnceDelivery, Delivery, DeliveryParts
from kafka_scorer.worker.engine import Engine
from kafka_scorer.worker.envelope import RecordCodec
from kafka_scorer.worker.exactly_once import ExactlyOnceDelivery
from kafka_scorer.worker.intake import Intake
from kafka_scorer.worker.ledger import Ledger
from kafka_scorer.worker.metrics import ProbeServer, Readiness, WorkerMetrics
from kafka_scorer.worker.outbox import Outbox
from kafka_scorer.worker.rebalance import Rebalance
from kafka_scorer.worker.ticket import Ticket
from kafka_scorer.worker.tracing import Tracing, from_environment

log = logging.getLogger(__name__)

_POLL_MS = 100  # longest the loop sits in one poll, so a stop request is seen quickly


def default_transactional_id(settings: Settings) -> str:
    return settings.transactional_id or f"{settings.group_id}.{settings.client_id}.{socket.gethostname()}"


class Worker:
    def __init__(
        self,
        settings: Settings,
        engine: Engine[Any, Any],
        metrics: WorkerMetrics | None = None,
        tracing: Tracing | None = None,
        readiness: Readiness | None = None,
    ) -> None:
        """`readiness`: the probes the caller already serves (cli/worker.py starts them before the model
        loads); without it `run` serves its own on `metrics_port`."""
        self.settings = settings
        self.engine = engine
        self.served = engine.served
        self.metrics = metrics or WorkerMetrics()
        self.metrics.watch_caches(engine)
        self.tracing = tracing if tracing is not None else from_environment()
        self.group_model = OneModelAssignor.serving(
            settings.group_id, self.served.description or {"model": self.served.name}
        )
        self.consumer = JobConsumer(settings, self.group_model.offered())
        self.topic_watch = TopicWatch(settings, self.consumer.cluster_partitions)
        self.broker_watch = BrokerWatch(settings.bootstrap_servers, self.consumer.cluster_partitions)
        txn_id = default_transactional_id(settings) if settings.delivery == "exactly_once" else None
        self.producer = ResultProducer(settings, transactional_id=txn_id)
        self.metrics.watch_sends(self.producer.stall.seconds)
        self.ledger = Ledger(settings, self.metrics, self.consumer)
        self.outbox = Outbox()
        self.batcher: Batcher[Any, Any] = Batcher(
            engine,
            self._batch_done,
            max_batch_tokens=settings.max_batch_tokens or engine.max_batch_tokens,
            max_batch_wait_ms=settings.max_batch_wait_ms,
            starve_ms=settings.priority_starve_ms if settings.scheduling == "priority" else None,
            share=settings.priority_share,
            on_expired=self._expired,
            queued_tokens_gauge=self.metrics.queued_tokens,
        )
        self.rebalance = Rebalance(
            settings, self.ledger, self.batcher, self.outbox, self.metrics, self.consumer
        )
        self.codec = RecordCodec(  # the record's edge both ways: intake decodes, delivery encodes
            reply_topic=settings.reply_topic,
            dead_letter_topic_for=settings.dead_letter_topic_for,
            max_message_bytes=settings.max_message_bytes,
            model_name=self.served.name,
            group_id=settings.group_id,
            max_header_bytes=settings.max_header_bytes,
        )
        policy = TimePolicy(settings.max_job_age_ms, settings.topic_priorities)
        self.intake = Intake(engine, self.ledger, self.batcher, self.outbox, self.codec, self.tracing, policy)
        self._fatal: BaseException | None = None
        self._serves_probes = readiness is None
        self.readiness = readiness or Readiness()
        self.readiness.follow(self.not_ready, lambda: self.healthy)
        self._said_ready = False

    @property
    def healthy(self) -> bool:
        """False once the worker can no longer score: a fatal error, or a device the batcher gave up on."""
        return self._failure() is None

    @property
    def ready(self) -> bool:
        return self.not_ready() is None

    def not_ready(self) -> str | None:
        """Why `/readyz` is 503 now (None: ready), from what the worker does: it is ready once it is a
        member of its group and consumes. Partitions assigned are proof enough that there is something
        to read; only a member with none asks the cluster's topic listing (kafka/topic_watch.py), so that an
        idle member of a group larger than its topic stays ready but a typo in the topics does not."""
        failure = self._failure()
        if failure is not None:
            return f"cannot score: {failure!r}"
        if self.ledger.draining:
            return "stopping: answering the jobs in flight"
        if not self.ledger.started:
            return f"connecting to the Kafka broker {self.settings.bootstrap_servers}"
        if not self.broker_watch.ready:
            return f"Kafka broker {self.settings.bootstrap_servers} unreachable"
        stalled = self.producer.stall.reason()
        if stalled is not None:
            return stalled
        if not self.group_model.ready:
            return (
                f"consumer group {self.settings.group_id!r} (group_id) serves another model "
                f"({self.group_model.serving_elsewhere}); this worker takes no partitions"
            )
        if not self.consumer.joined:
            return f"joining consumer group {self.settings.group_id!r}"
        if not self.consumer.assignment() and not self.topic_watch.ready:
            return "the request topics match no partition in the cluster (topic_grace_s)"
        return None

    async def run(self, stop: asyncio.Event) -> int:
        """Serve until `stop` is set; 0 after a clean drain, 1 after a fatal error."""
        probe = self._probe() if self._serves_probes else None
        if probe is not None:
            await probe.start()
        background: list[asyncio.Task[None]] = []
        try:
            # Both retry while the cluster is unreachable; a signal meanwhile ends the start-up cleanly.
            if not await _unless_stopped(self.producer.start(), stop):
                return 0
            self.outbox.delivery = self._delivery()
            if not await _unless_stopped(self.consumer.start(self.rebalance), stop):
                return 0
            background = [
                asyncio.create_task(self.batcher.run(), name="batcher"),
                asyncio.create_task(self.outbox.delivery.run(), name="committer"),
                asyncio.create_task(self.topic_watch.run(stop), name="topic-watch"),
                asyncio.create_task(self.broker_watch.run(stop), name="broker-watch"),
            ]
            self._started()
            await self._serve(stop, background)
            self._check(background)  # a fault that came with the stop request still makes the exit fatal
            if self._fatal is None:
                await self._drain()
                self._check(background)
        except FatalError as exc:  # its message is the one line that says why (below); the trace on debug
            log.debug("worker failed", exc_info=True)
            self._fatal = self._fatal or exc
        except Exception as exc:  # catch-all, on purpose: a bug ends the worker with exit 1 too
            log.exception("worker failed")
            self._fatal = self._fatal or exc
        finally:
            await self._close(background, probe)
        if self._fatal is not None:
            log.error("worker stopped after a fatal error: %r", self._fatal)
            return 1
        log.info("worker stopped cleanly")
        return 0

    async def _serve(self, stop: asyncio.Event, background: list[asyncio.Task[None]]) -> None:
        """Fetch, accept, repeat: everything else happens on the tasks and threads the records reach."""
        while not stop.is_set() and self._fatal is None:
            self._check(background)
            records = await self.consumer.fetch(_POLL_MS, self.settings.max_poll_records)
            self.metrics.set_lag(self.consumer.lag(self.ledger.tracker.committed_offsets()))
            if records:
                await self.intake.accept(records)
            self._say_readiness()
            await self.rebalance.after_log_resets(await self.consumer.reposition_reset_logs())

    def _started(self) -> None:
        self.ledger.started = True
        served = dict(self.served.description) or {"model": self.served.name}
        self.metrics.describe(__version__, served)
        log.info("serving %s", " ".join(f"{key}={value}" for key, value in served.items()))

    def _say_readiness(self) -> None:
        """`worker ready` once, the first time `/readyz` would answer 200 (never while it is 503: a
        worker kept out of its group says why in its own ERROR and stays quiet here). Later changes
        are said by what causes them: the outage watch, the topic watch, the group's model, the stop."""
        if not self._said_ready and self.ready:
            self._said_ready = True
            log.info(
                "worker ready: model=%s topics=%s group=%s delivery=%s producer=%s",
                self.served.name,
                self.settings.request_topic_pattern or ",".join(self.settings.request_topics),
                self.settings.group_id,
                "exactly_once" if isinstance(self.outbox.delivery, ExactlyOnceDelivery) else "at_least_once",
                self.producer.mode,
            )

    def _batch_done(self, done: BatchDone[Any]) -> None:
        report_batch(done, self.metrics, self.tracing)
        self.outbox.send(done.tickets)

    def _expired(self, tickets: list[Ticket[Any]]) -> None:
        now = time.monotonic()
        self.outbox.send([ticket.expire(now) for ticket in tickets])

    def _probe(self) -> ProbeServer | None:
        if not self.settings.metrics_port:
            return None
        s = self.settings
        return ProbeServer(self.metrics, self.readiness, s.metrics_host, s.metrics_port)

    def _delivery(self) -> Delivery:
        parts = DeliveryParts(
            self.producer, self.ledger.tracker, self.metrics, self.served, self.consumer, self.codec
        )
        if self.producer.transactional:
            return ExactlyOnceDelivery(parts, self.rebalance, group_id=self.settings.group_id)
        return AtLeastOnceDelivery(parts)

    def _failure(self) -> BaseException | None:
        return self._fatal or self.outbox.failure or self.batcher.failure

    def _check(self, background: list[asyncio.Task[None]]) -> None:
        """Raise what ended the worker's work elsewhere (a device error, a failed delivery, a bug)."""
        failure = self._failure()
        if failure is not None:
            raise failure
        for task in background:
            if task.done() and not task.cancelled() and (exc := task.exception()) is not None:
                raise exc

    async def _drain(self) -> None:
        """Stop fetching; answer and commit everything in flight, within the grace period."""
        self.ledger.draining = True
        self.consumer.pause()
        self.batcher.drain()
        grace = self.settings.shutdown_grace_s
        deadline = time.monotonic() + grace
        log.info("stopping: %d jobs in flight, %.1fs grace", self.ledger.jobs, grace)
        while self.ledger.jobs and time.monotonic() < deadline and self.healthy:
            # Keep polling (all partitions paused) so the group membership stays alive meanwhile.
            records = await self.consumer.fetch(20, self.settings.max_poll_records)
            if records:
                await self.intake.accept(records)
        assert self.outbox.delivery is not None
        try:
            await asyncio.wait_for(self.outbox.delivery.commit(), max(0.1, deadline - time.monotonic()))
        except (KafkaError, TimeoutError) as exc:
            log.error("final commit failed (%r): the uncommitted jobs will be scored again", exc)
        if self.ledger.jobs:
            log.warning(
                "grace period over: %d jobs unanswered and uncommitted; their next reader redoes them",
                self.ledger.jobs,
            )

    async def _close(self, background: list[asyncio.Task[None]], probe: ProbeServer | None) -> None:
        self.ledger.draining = True
        for task in background:
            task.cancel()
        await self.outbox.close()
        await asyncio.gather(*background, return_exceptions=True)
        await self.consumer.stop()
        await self.producer.stop()
        self.batcher.close()
        self.intake.close()
        self.tracing.close()
        if probe is not None:
            await probe.stop()


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
