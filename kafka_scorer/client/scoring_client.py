"""`ScoringClient`: send jobs to the scoring service and await their results, from any asyncio code.

One producer and one reply reader serve every call, so thousands of requests can be in flight at
once; each call is matched to its result by a fresh correlation id (SPEC §2, §3). This is the one
request-reply implementation of the project: `kafka-scorer submit` and the demo are built on it.

Choices where the contract is silent (also in docs/client.md):
- A call's timeout is also the job's deadline: the record's timestamp is the call's start and the job
  carries `timeout_ms` ending when the call gives up (a job's own, shorter `timeout_ms` is kept), so a
  worker can leave uncomputed what nobody waits for any more (SPEC §9).
- `score` and `score_job` raise `JobFailed` for an error result; `request` returns every result, error
  or not, for callers that count failures rather than handle them (submit).
- A job without an `id` gets its correlation id as `id`; the record key is the job id; the
  `reply_topic` header names the topic this client reads, whatever the worker's default is.
- Settings are the worker's (`Settings`: flags' keywords over `KAFKA_SCORER_*` over `.env`), so a
  client next to a worker needs no configuration and reaches the cluster through the same TLS and
  SASL code (worker/connection.py, worker/preflight.py).

Light at import (no torch, no aiokafka until `start`): a web service imports it at start-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from typing import TYPE_CHECKING, Any

import msgspec

from kafka_scorer import errors
from kafka_scorer.client.errors import JobFailed, NotSent, ScoringTimeout
from kafka_scorer.client.replies import CORRELATION_HEADER, ReplyListener
from kafka_scorer.wire.protocol import Job, Result, WireFormat, content_type_of, encode_job

if TYPE_CHECKING:
    from kafka_scorer.config import Settings

REPLY_TOPIC_HEADER = "reply_topic"
METADATA_WAIT_S = 10.0
"""Longest wait for a topic's partitions; a broker without auto-creation never gives them."""
DEFAULT_TIMEOUT_S = 60.0


class _Default:
    """Marks "the client's default timeout" apart from None (no timeout at all)."""


_DEFAULT = _Default()


class ScoringClient:
    """`async with ScoringClient(...) as client: result = await client.score(query, items, ...)`."""

    def __init__(
        self,
        bootstrap_servers: str | None = None,
        request_topic: str | None = None,
        reply_topic: str | None = None,
        *,
        settings: Settings | None = None,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        format: WireFormat = "json",
        **connection: Any,
    ) -> None:
        """`settings` (the worker's `Settings`) or connection keywords named like its fields
        (`security_protocol`, `sasl_username`, `ssl_cafile`, ...), which win over the `KAFKA_SCORER_*`
        environment and `.env`. `timeout` is every call's default, in seconds (None: wait for ever)."""
        if settings is not None and (bootstrap_servers is not None or connection):
            raise TypeError("give either settings or connection keywords, not both")
        if settings is None:
            settings = _settings(bootstrap_servers=bootstrap_servers, **connection)
        self.settings = settings
        self.request_topic = request_topic or settings.request_topics[0]
        self.reply_topic = reply_topic or settings.reply_topic
        self.timeout = timeout
        self.format: WireFormat = format
        self._stack = contextlib.AsyncExitStack()
        self._producer: Any = None
        self._replies: ReplyListener | None = None
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> ScoringClient:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Connect, check both topics exist and start listening on the reply topic's end.

        A TLS or SASL refusal raises `SettingError` naming the setting; an unreachable broker raises
        aiokafka's connection error; a missing topic `UserFacingError` (errors.explain words each)."""
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

        from kafka_scorer.worker.connection import client_options
        from kafka_scorer.worker.preflight import check_connection

        await check_connection(self.settings)
        options = client_options(self.settings)
        # Each client is built only once the previous one started: aiokafka complains at exit about
        # a client that was created and never closed, noise on top of the one-line error.
        self._producer = await self._started(AIOKafkaProducer(**options, acks="all", linger_ms=5))
        consumer = await self._started(
            AIOKafkaConsumer(
                **options,
                group_id=None,
                enable_auto_commit=False,
                auto_offset_reset="latest",
                fetch_max_wait_ms=self.settings.fetch_max_wait_ms,
            )
        )
        await self._partitions(self.request_topic)
        replies = ReplyListener(consumer, self.reply_topic)
        await replies.listen_from_end(await self._partitions(self.reply_topic))
        self._replies = replies
        self._reader = asyncio.create_task(replies.run(), name="kafka-scorer-replies")

    async def close(self) -> None:
        """Stop reading and sending; calls still waiting raise `ClientClosed`."""
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(BaseException):
                await self._reader
            self._reader = None
        await self._stack.aclose()

    async def score(
        self,
        query: str | list[int],
        items: list[str | list[int]],
        *,
        timeout: float | _Default | None = _DEFAULT,
        **fields: Any,
    ) -> Result:
        """Score `query` against `items`; `fields` are the job's other fields (SPEC §2, §8, §9), e.g.
        `label_token_ids=[9454, 2753]`, `apply_softmax=True`, `top_n=5`. Raises `JobFailed` for an
        error result, `ScoringTimeout` when none came in time."""
        job = msgspec.convert({"query": query, "items": items, **fields}, Job)
        return await self.score_job(job, timeout=timeout)

    async def score_job(self, job: Job, *, timeout: float | _Default | None = _DEFAULT) -> Result:
        """`score` for a ready `Job`: its result, or `JobFailed` for an error result."""
        result = await self.request(job, timeout=timeout)
        if result.error is not None:
            raise JobFailed(result)
        return result

    async def request(
        self,
        job: Job,
        *,
        timeout: float | _Default | None = _DEFAULT,
        correlation_id: str | None = None,
    ) -> Result:
        """Send one job and wait for its result, error results included (they are returned).

        Raises `ScoringTimeout` when no result came within `timeout` seconds (the client's default
        unless given; None: no limit), `NotSent` when the job could not be produced, `ClientClosed`
        when the client closed meanwhile."""
        if self._replies is None or self._producer is None:
            raise RuntimeError("ScoringClient is not started: use `async with` or await start()")
        limit = self.timeout if isinstance(timeout, _Default) else timeout
        correlation_id = correlation_id or str(uuid.uuid4())
        sent_at_ms = time.time_ns() // 1_000_000
        job = _addressed(job, correlation_id, limit)
        future = self._replies.expect(correlation_id)
        try:
            return await asyncio.wait_for(self._exchange(job, correlation_id, sent_at_ms, future), limit)
        except asyncio.TimeoutError:
            raise ScoringTimeout(job.id or correlation_id, limit or 0.0) from None
        finally:
            self._replies.forget(correlation_id)

    async def _exchange(
        self, job: Job, correlation_id: str, timestamp_ms: int, future: asyncio.Future[Result]
    ) -> Result:
        await self._send(job, correlation_id, timestamp_ms)
        return await future

    async def _send(self, job: Job, correlation_id: str, timestamp_ms: int) -> None:
        """Produce the job and wait for the broker's acknowledgement."""
        headers = [
            (CORRELATION_HEADER, correlation_id.encode()),
            (REPLY_TOPIC_HEADER, self.reply_topic.encode()),
            ("content-type", content_type_of(self.format).encode()),
        ]
        job_id = job.id or correlation_id
        try:
            delivery = await self._producer.send(
                self.request_topic,
                value=encode_job(job, self.format),
                key=job_id.encode(),
                headers=headers,
                timestamp_ms=timestamp_ms,
            )
            await delivery
        except Exception as exc:  # e.g. a job larger than the producer's request limit
            raise NotSent(job_id, f"{type(exc).__name__}: {exc}") from exc

    async def _started(self, client: Any) -> Any:
        """Start an aiokafka client and make sure it is stopped, also when start itself fails."""
        self._stack.push_async_callback(client.stop)
        await client.start()
        return client

    async def _partitions(self, topic: str) -> set[int]:
        """The topic's partitions; on a broker that creates topics on demand this creates it."""
        from aiokafka.errors import UnknownTopicOrPartitionError

        try:
            return await asyncio.wait_for(self._producer.partitions_for(topic), METADATA_WAIT_S)
        except (TimeoutError, UnknownTopicOrPartitionError):
            raise errors.UserFacingError(
                f"topic {topic!r} does not exist on {self.settings.bootstrap_servers} and the broker does "
                f"not create topics on demand: create it (kafka-topics.sh --create --topic {topic}) or "
                "name another one"
            ) from None


def _addressed(job: Job, correlation_id: str, timeout_s: float | None) -> Job:
    """The job as sent: its id (the correlation id when it has none) and a deadline no later than the
    call's own, so the worker knows when its sender stops waiting."""
    changes: dict[str, object] = {}
    if job.id is None:
        changes["id"] = correlation_id
    if timeout_s is not None:
        deadline_ms = max(1, math.ceil(timeout_s * 1000))
        if job.timeout_ms is None or job.timeout_ms > deadline_ms:
            changes["timeout_ms"] = deadline_ms
    return msgspec.structs.replace(job, **changes) if changes else job


def _settings(**given: Any) -> Settings:
    """The worker's settings, with the keywords that were given over the environment."""
    from kafka_scorer.config import Settings

    return Settings(**{name: value for name, value in given.items() if value is not None})
