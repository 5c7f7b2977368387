"""Results and dead letters out: acks=all, idempotence where the broker allows, transactions on request.

What this module decides:
- Start-up asks for the strongest producer the mode wants (transactional for exactly-once, else
  idempotent) and, when the broker refuses the InitProducerId handshake (the embedded tansu broker does,
  see docs/worker.md, "The embedded brokers"), falls back to a plain acks=all producer with one clear
  WARNING line. A
  broker that is merely unreachable is not a refusal: start-up keeps retrying with backoff instead.
- A send that fails with a retriable error (broker down, leader moving) is retried with backoff until it
  is acknowledged, because an offset is committed only after its answer is acknowledged (SPEC §7).
- A send the broker refuses outright (topic not authorised, illegal name, record too large for the topic)
  is tried `_REFUSAL_ATTEMPTS` times and then raised as a `Refused`, and a topic the broker answers for
  but does not have is waited for `missing_topic_grace_s` and then refused the same way. aiokafka calls a
  missing topic retriable and would retry it forever (a broker that does not auto-create never gets it),
  stalling the partition's commits; bounding it lets the delivery layer answer elsewhere or stop.
  The worker's own reply topic is the exception: start-up checked that it exists (kafka/preflight.py),
  so its absence later is the cluster's state, not the operator's mistake (a broker back on an empty
  disk, its topics recreated later: issue 45). Its results are held, the wait said once, until it exists
  again: backpressure pauses the reading meanwhile, and nothing stops the worker or is skipped.
- Records that cannot fit a produce request are caught before they are sent (`fits`), so the caller
  can answer with an error result instead of looping on a request that can never succeed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    InvalidTopicError,
    KafkaError,
    ProducerFenced,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    UnknownError,
    UnknownTopicOrPartitionError,
)
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from kafka_scorer.config import Settings
from kafka_scorer.errors import FatalError
from kafka_scorer.kafka.connection import client_options
from kafka_scorer.kafka.framing import ResultFraming
from kafka_scorer.kafka.records import OutRecord
from kafka_scorer.kafka.retry import Backoff, is_retriable
from kafka_scorer.kafka.send_stall import ReplicaRefusals, SendStall
from kafka_scorer.wire.registry import RegistryError

log = logging.getLogger(__name__)

_SLACK_BYTES = 1 << 20  # room for headers and batch framing on top of the largest record we accept
_REFUSAL_ATTEMPTS = 3  # a refusal can be passing (ACLs propagating); three tries, ~0.3 s, then it stands
_MISSING_TOPIC_GRACE_S = 10.0  # how long a topic the broker says it lacks may take to appear (auto-create)
# The longest a transaction's offset commit (or its abort) may take before the transaction counts as failed:
# Apache Kafka 4.1 answers TxnOffsetCommit for a topic it does not have (deleted under a running worker)
# with UNKNOWN_TOPIC_OR_PARTITION, which aiokafka 0.14 retries for ever; the worker hung inside the
# transaction instead of aborting it and rewinding (found by the delivery contract on Apache Kafka).
_TRANSACTION_STEP_S = 30.0
_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")  # Kafka's rule for topic names


class FatalProducerError(FatalError):
    """The producer cannot go on (fenced by a newer instance with the same transactional id)."""


class StaleTransaction(KafkaError):
    """The transaction was aborted before its commit: the group membership (or a partition) its offsets
    were taken under is gone, and the broker cannot refuse its offsets for us (aiokafka's
    `send_offsets_to_transaction` carries no generation). Its records are the partitions' next reader's."""

    retriable = True


class Refused(KafkaError):
    """The broker will not take this record, for good: the topic is missing, illegal or not authorised,
    or the record is too large for it. Raised after bounded tries; `cause` is the broker's answer."""

    retriable = False

    def __init__(self, topic: str, cause: BaseException) -> None:
        super().__init__(f"topic {topic!r} refused the record: {cause!r}")
        self.topic = topic
        self.cause = cause


class ResultProducer:
    """One aiokafka producer for results and dead letters; `mode` says what the broker granted."""

    def __init__(
        self,
        settings: Settings,
        transactional_id: str | None = None,
        *,
        missing_topic_grace_s: float = _MISSING_TOPIC_GRACE_S,
        transaction_step_s: float = _TRANSACTION_STEP_S,
    ) -> None:
        self._settings = settings
        self._transactional_id = transactional_id
        self.missing_topic_grace_s = missing_topic_grace_s
        self.transaction_step_s = transaction_step_s
        self.max_request_size = settings.max_message_bytes + _SLACK_BYTES
        self._producer: AIOKafkaProducer | None = None
        self._framing = ResultFraming.from_settings(settings)
        self.mode = "stopped"  # "transactional" | "idempotent" | "plain"
        self._holding_replies = False  # the reply topic is missing and results wait for it
        self.stall = SendStall()  # sends waiting for an acknowledgement: /readyz and a gauge (send_stall.py)
        self._refusals = ReplicaRefusals(self.stall)

    @property
    def transactional(self) -> bool:
        return self.mode == "transactional"

    def _make(self, *, idempotent: bool, transactional: bool) -> AIOKafkaProducer:
        options: dict[str, Any] = client_options(self._settings)
        return AIOKafkaProducer(
            **options,
            acks="all",
            enable_idempotence=idempotent or transactional,
            transactional_id=self._transactional_id if transactional else None,
            compression_type=None if self._settings.compression == "none" else self._settings.compression,
            max_request_size=self.max_request_size,
            linger_ms=2,
        )

    async def start(self) -> None:
        """Start the strongest producer the broker grants; retry while the broker is unreachable."""
        self._refusals.install()
        wants_txn = self._transactional_id is not None
        attempts = (
            [(True, True), (True, False), (False, False)] if wants_txn else [(True, False), (False, False)]
        )
        backoff = Backoff()
        index = 0
        while True:
            idempotent, transactional = attempts[index]
            producer = self._make(idempotent=idempotent, transactional=transactional)
            try:
                with _sender_errors_muted(idempotent):
                    await producer.start()
            except Exception as exc:  # each start-up failure is classified below: retried, or fallen back
                await _quiet_stop(producer)
                if is_retriable(exc):
                    # Unreachable, or busy (a coordinator loading, an earlier transaction still
                    # aborting): passing trouble, not a refusal, so the same producer is tried again.
                    log.warning(
                        "producer: broker %s unreachable or busy (%r); retrying in %.1fs",
                        self._settings.bootstrap_servers,
                        exc,
                        backoff.next_s,
                    )
                    await backoff.sleep()
                    continue
                if not isinstance(exc, KafkaError) or index == len(attempts) - 1:
                    raise  # nothing weaker left to try (e.g. authentication failed): fatal
                index = self._refused(exc, attempts, index)
                continue
            self._producer = producer
            self.mode = "transactional" if transactional else "idempotent" if idempotent else "plain"
            log.info("producer started (%s, acks=all, compression=%s)", self.mode, self._settings.compression)
            return

    def _refused(self, exc: KafkaError, attempts: list[tuple[bool, bool]], index: int) -> int:
        """Log the broker's refusal of the producer `attempts[index]`; the index of the next to try."""
        transactional = attempts[index][1]
        refused = "transactions" if transactional else "idempotent producing"
        fallback = "an idempotent producer" if attempts[index + 1][0] else "a plain acks=all producer"
        if transactional:
            log.error(
                "producer: broker refused %s (%r); delivery degrades to at-least-once with %s — "
                "results may be duplicated after a crash%s",
                refused,
                exc,
                fallback,
                self._grant_hint(exc),
            )
        elif _embedded_refusal(exc, self._settings.bootstrap_servers):
            log.info(
                "producer: broker refused %s (%r), as the embedded tansu broker does; falling back to %s",
                refused,
                exc,
                fallback,
            )
        else:
            log.warning(
                "producer: broker refused %s (%r); falling back to %s%s",
                refused,
                exc,
                fallback,
                self._grant_hint(exc),
            )
        return index + 1

    def _grant_hint(self, exc: KafkaError) -> str:
        """The ACL that would lift an authorization refusal (docs/operations.md), else nothing."""
        if isinstance(exc, TransactionalIdAuthorizationFailed):
            return (
                f"; grant this worker's principal Write and Describe on the transactional id "
                f"{self._transactional_id} (setting: transactional_id)"
            )
        if isinstance(exc, ClusterAuthorizationFailedError):
            return (
                "; grant this worker's principal Write on the reply topic (Kafka 3.0+), or IdempotentWrite "
                "on the cluster (setting: reply_topic)"
            )
        return ""

    async def stop(self) -> None:
        producer, self._producer = self._producer, None
        self.mode = "stopped"
        self._refusals.remove()
        if producer is not None:
            await _quiet_stop(producer)

    def fits(self, record: OutRecord) -> bool:
        size = DefaultRecordBatchBuilder.estimate_size_in_bytes(record.key, record.value, record.headers)
        return size <= self.max_request_size

    @property
    def _client(self) -> AIOKafkaProducer:
        if self._producer is None:
            raise RuntimeError("producer is not started")
        return self._producer

    async def send(self, record: OutRecord) -> None:
        """Send one record and wait for its acknowledgement, retrying while the failure is passing.

        A refusal (see the module docstring) is raised as `Refused` after bounded tries: retrying it for
        ever would block the partition's commits for good.
        """
        with self.stall.sending():
            await self._send(record)

    async def _send(self, record: OutRecord) -> None:
        backoff = Backoff()
        refusals = 0
        while True:
            try:
                await self.ensure_topic(record.topic)
                value = await self._value(record)
                future = await self._client.send(
                    record.topic, value=value, key=record.key, headers=record.headers
                )
                await future
                return
            except ProducerFenced as exc:
                raise FatalProducerError(str(exc)) from exc
            except Refused:
                raise
            except RegistryError as exc:
                if not exc.retriable:
                    raise Refused(record.topic, exc) from exc
                log.warning(
                    "producer: %s (setting: schema_registry_url); retrying in %.1fs", exc, backoff.next_s
                )
                await backoff.sleep()
            except Exception as exc:  # classified: retried, refused (broker's answer) or re-raised (a bug)
                if not is_retriable(exc):
                    if not isinstance(exc, KafkaError):
                        raise  # not the broker's answer: a bug, which must not pass for a refusal
                    refusals += 1
                    if refusals >= _REFUSAL_ATTEMPTS:
                        raise Refused(record.topic, exc) from exc
                self.stall.failed(exc)
                log.warning(
                    "producer: send to %s failed (%r); retrying in %.1fs", record.topic, exc, backoff.next_s
                )
                await backoff.sleep()

    async def _value(self, record: OutRecord) -> bytes | None:
        """The value as produced: framed for the schema registry when one is configured (framing.py)."""
        return record.value if self._framing is None else await self._framing.value(record)

    async def ensure_topic(self, topic: str) -> None:
        """Return once the cluster metadata has `topic`; `Refused` when the broker keeps answering without
        it for `missing_topic_grace_s`, except for the worker's own reply topic, which is waited for (see
        the module docstring). Time while the broker cannot be reached does not count: that is an outage,
        retried like any other."""
        client = self._client.client
        if client.cluster.partitions_for_topic(topic) is not None:
            return
        if not _LEGAL_TOPIC.fullmatch(topic) or topic in (".", ".."):
            raise Refused(topic, InvalidTopicError(f"{topic!r} is not a legal Kafka topic name"))
        client.add_topic(topic)
        backoff = Backoff(cap_s=1.0)
        missing_since: float | None = None
        while True:
            answered = await client.force_metadata_update()
            if client.cluster.partitions_for_topic(topic) is not None:
                self._reply_back(topic)
                return
            if topic in client.cluster.unauthorized_topics:
                raise Refused(topic, TopicAuthorizationFailedError(topic))
            if answered and topic == self._settings.reply_topic:
                self._reply_missing(topic)
            elif answered:
                now = time.monotonic()
                missing_since = missing_since if missing_since is not None else now
                if now - missing_since >= self.missing_topic_grace_s:
                    raise Refused(topic, UnknownTopicOrPartitionError(topic))
            await backoff.sleep()

    def _reply_missing(self, topic: str) -> None:
        """Said once however many results wait (every send in flight waits on its own)."""
        self.stall.failed(f"reply topic {topic!r} missing from the cluster")
        if not self._holding_replies:
            self._holding_replies = True
            log.warning(
                "producer: reply topic %r is missing from the cluster (a broker back on an empty disk, or "
                "the topic deleted); holding its results until it exists again, reading paused meanwhile "
                "(setting: reply_topic)",
                topic,
            )

    def _reply_back(self, topic: str) -> None:
        if self._holding_replies and topic == self._settings.reply_topic:
            self._holding_replies = False
            log.info("producer: reply topic %r exists again; the results held for it go out now", topic)

    async def send_transaction(
        self,
        records: Sequence[OutRecord],
        offsets: dict[TopicPartition, int],
        group_id: str,
        still_ours: Callable[[], bool] = lambda: True,
    ) -> None:
        """Produce `records` and commit the consumer `offsets`, atomically.

        Any failure aborts the transaction and is raised: the caller must rewind to the last
        committed offsets. `still_ours` is asked last, right before the commit: False aborts it as
        `StaleTransaction` (a membership lost while the transaction waited on a moving coordinator).
        """
        with self.stall.sending():
            await self._transaction(records, offsets, group_id, still_ours)

    async def _transaction(
        self,
        records: Sequence[OutRecord],
        offsets: dict[TopicPartition, int],
        group_id: str,
        still_ours: Callable[[], bool],
    ) -> None:
        producer = self._client
        values = [await self._value(r) for r in records]  # registry look-ups before the transaction opens
        try:
            await producer.begin_transaction()
        except ProducerFenced as exc:
            raise FatalProducerError(str(exc)) from exc
        try:
            futures = [
                await producer.send(r.topic, value=v, key=r.key, headers=r.headers)
                for r, v in zip(records, values, strict=True)
            ]
            await asyncio.gather(*futures)
            if offsets:  # bounded: aiokafka retries an offset commit for a topic the broker lacks for ever
                await asyncio.wait_for(
                    producer.send_offsets_to_transaction(offsets, group_id), self.transaction_step_s
                )
            if not still_ours():
                raise StaleTransaction("the group membership its offsets were taken under is gone")
            await producer.commit_transaction()
        except ProducerFenced as exc:
            raise FatalProducerError(str(exc)) from exc
        except BaseException as exc:  # anything (a cancel too) leaves the transaction open: abort, re-raise
            self.stall.failed(exc)
            try:
                await asyncio.wait_for(producer.abort_transaction(), self.transaction_step_s)
            except Exception as abort_exc:  # a failed or hung abort is cleared by restarting the producer
                log.warning("producer: abort_transaction failed (%r); restarting the producer", abort_exc)
                await self.stop()
                await self.start()  # InitProducerId with the same id aborts the open transaction
            raise


async def _quiet_stop(producer: AIOKafkaProducer) -> None:
    try:
        await producer.stop()
    except Exception as exc:  # stopping a half-started client can fail in many ways; none matter here
        log.debug("producer stop: %r", exc)


class _ErrorsHeld(logging.Filter):
    """One attempt's hold on the sender's ERROR lines (an object per attempt: each removes only its own)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR


@contextlib.contextmanager
def _sender_errors_muted(muted: bool) -> Iterator[None]:
    """aiokafka logs a broker's refusal of InitProducerId at ERROR before raising it; `start` says it
    better in one line (refusal and fallback), so the client's ERROR lines are held back during the
    attempt. A filter of its own, not the logger's level: two producers starting at once (two workers in
    one process, a producer restarted beside a starting one) each saved and restored the level, and the
    later restore left it at CRITICAL for good, which silenced every later WARNING of the sender,
    `NotEnoughReplicas` among them (send_stall.py's one line about min.insync.replicas never came)."""
    sender_log = logging.getLogger("aiokafka.producer.sender")
    if not muted:
        yield
        return
    held = _ErrorsHeld()
    sender_log.addFilter(held)
    try:
        yield
    finally:
        sender_log.removeFilter(held)


def _embedded_refusal(exc: KafkaError, bootstrap_servers: str) -> bool:
    """The embedded tansu broker's answer to aiokafka's InitProducerId (a bare UnknownError) on a
    loopback address: expected on every laptop run, so it is INFO there; on a real cluster a refused
    idempotent producer is worth a WARNING."""
    hosts = [entry.rsplit(":", 1)[0].strip("[] ") for entry in bootstrap_servers.split(",") if entry.strip()]
    loopback = bool(hosts) and all(host in ("localhost", "127.0.0.1", "::1") for host in hosts)
    return loopback and type(exc) is UnknownError
