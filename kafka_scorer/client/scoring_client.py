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
  SASL code (kafka/connection.py, kafka/preflight.py).
- A broker outage is waited out, not reported call by call: `start` retries for `connect_timeout`
  (connect.py), a send for the call's own timeout (sending.py), the reply reader re-reads a log the
  broker lost (reply_reader.py), and aiokafka's hundreds of reconnect lines become the worker's two
  (kafka/outage.py).
- Every error is a `ScoringError` (errors.py); a bad argument is `InvalidJob` before anything is sent.

Light at import (no torch, no aiokafka until `start`): a web service imports it at start-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import math
import sys
import time
import uuid
from typing import TYPE_CHECKING, Any

import msgspec

from kafka_scorer.client.arguments import checked_correlation_id, checked_timeout, encoded, job_from_fields
from kafka_scorer.client.connect import DEFAULT_CONNECT_TIMEOUT_S, connect, connect_budget
from kafka_scorer.client.errors import (
    InvalidJob,
    InvalidSetting,
    JobFailed,
    NotSent,
    NotStarted,
    ScoringTimeout,
    TopicMissing,
)
from kafka_scorer.client.replies import CORRELATION_HEADER, ReplyListener
from kafka_scorer.client.reply_reader import ReplyReader
from kafka_scorer.client.sending import SendAttempts
from kafka_scorer.wire.content import Content
from kafka_scorer.wire.protocol import Job, Result, WireFormat, content_type_of

if TYPE_CHECKING:
    from kafka_scorer.config import Settings

REPLY_TOPIC_HEADER = "reply_topic"
METADATA_WAIT_S = 10.0
"""Longest wait for a topic's partitions; a broker without auto-creation never gives them."""
DEFAULT_TIMEOUT_S = 60.0
WHILE_DOWN = (
    "calls wait, each send is retried within its call's timeout, and the client resumes when a broker "
    "answers (no restart needed). Check the broker, and the client's bootstrap_servers "
    "(KAFKA_SCORER_BOOTSTRAP_SERVERS)"
)
"""What the client's outage line says (kafka/outage.py's BrokerWatch speaks it)."""


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
        connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT_S,
        format: WireFormat = "json",
        **connection: Any,
    ) -> None:
        """`settings` (the worker's `Settings`) or connection keywords named like its fields
        (`security_protocol`, `sasl_username`, `ssl_cafile`, ...), which win over the `KAFKA_SCORER_*`
        environment and `.env`. `timeout` is every call's default, in seconds (None: wait for ever);
        `connect_timeout` how long `start` retries an unreachable broker (0: once; None: for ever).
        A bad value raises `InvalidSetting`."""
        if settings is not None and (bootstrap_servers is not None or connection):
            raise InvalidSetting("settings", "give either settings or connection keywords, not both")
        if settings is None:
            settings = _settings(bootstrap_servers=bootstrap_servers, **connection)
        if format not in ("json", "msgpack"):
            raise InvalidSetting("format", f"format must be 'json' or 'msgpack', not {format!r}")
        try:
            self.timeout = checked_timeout(timeout)
        except InvalidJob as exc:
            raise InvalidSetting("timeout", str(exc)) from None
        self._connect_budget_s = connect_budget(connect_timeout)
        self.settings = settings
        if not (request_topic or settings.request_topics):
            raise InvalidSetting(
                "request_topics", "no request topic: pass request_topic or set KAFKA_SCORER_REQUEST_TOPICS"
            )
        self.request_topic = request_topic or settings.request_topics[0]
        self.reply_topic = reply_topic or settings.reply_topic
        self.format: WireFormat = format
        self._stack = contextlib.AsyncExitStack()
        self._producer: Any = None
        self._replies: ReplyListener | None = None
        self._reader: ReplyReader | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> ScoringClient:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def resets(self) -> int:
        """Reply partitions read again from the start of a new log (a broker that lost its data)."""
        return 0 if self._reader is None else self._reader.resets

    async def start(self) -> None:
        """Connect, check both topics exist and start listening on the reply topic's end.

        An unreachable broker is retried for `connect_timeout`, then `BrokerUnreachable`; a TLS or
        SASL refusal raises `InvalidSetting` naming the setting; a missing topic `TopicMissing`."""
        if self._replies is not None:
            return
        try:
            consumer = await connect(
                self.settings, self._connect_budget_s, self._start_clients, self._stack.aclose
            )
            watch = self._broker_watch()
            replies = ReplyListener()
            reader = ReplyReader(
                consumer,
                self.reply_topic,
                replies,
                new_consumer=self._new_consumer,
                broker_ready=lambda: watch.ready,
            )
            await reader.listen_from_end(await self._partitions(self.reply_topic))
            self._replies, self._reader = replies, reader
            stop = asyncio.Event()
            self._stack.callback(stop.set)
            self._tasks = [
                asyncio.create_task(reader.run(), name="kafka-scorer-replies"),
                asyncio.create_task(watch.run(stop), name="kafka-scorer-broker-watch"),
            ]
        except BaseException:
            await self.close()  # nothing left started for a caller that does not close after a failure
            raise

    async def _start_clients(self) -> Any:
        """The producer and the reply consumer, started; the request topic checked."""
        from kafka_scorer.kafka.connection import new_producer

        # Each client is built only once the previous one started: aiokafka complains at exit about
        # a client that was created and never closed, noise on top of the one-line error.
        self._producer = await self._started(new_producer(self.settings, acks="all", linger_ms=5))
        consumer = await self._started(self._new_consumer())
        await self._partitions(self.request_topic)
        return consumer

    def _new_consumer(self) -> Any:
        """A consumer of the reply topic, unstarted: no group, positions set by the reply reader."""
        from kafka_scorer.kafka.connection import new_consumer

        return new_consumer(
            self.settings,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",  # a position the log lost: read it again, never skip it
            fetch_max_wait_ms=self.settings.fetch_max_wait_ms,
        )

    def _broker_watch(self) -> Any:
        """The worker's outage summary (kafka/outage.py), in the client's words."""
        from kafka_scorer.kafka.outage import BrokerWatch

        return BrokerWatch(
            self.settings.bootstrap_servers, self._producer.client.fetch_all_metadata, while_down=WHILE_DOWN
        )

    async def close(self) -> None:
        """Stop reading and sending; calls still waiting raise `ClientClosed`."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        await self._stack.aclose()
        self._producer, self._replies = None, None  # the reader stays, for its `resets`

    async def score(
        self,
        query: str | list[int] | Content | dict[str, Any],
        items: list[Any],
        *,
        timeout: float | _Default | None = _DEFAULT,
        **fields: Any,
    ) -> Result:
        """Score `query` against `items`; `fields` are the job's other fields (SPEC §2, §8, §9), e.g.
        `label_token_ids=[9454, 2753]`, `apply_softmax=True`, `top_n=5`. A query or item may be content
        parts with images (SPEC §11): `{"content": [{"type": "image", "image": png_bytes}, ...]}`, raw
        bytes sent as such in MessagePack and as base64 in JSON. Raises `InvalidJob` for a bad field,
        `JobFailed` for an error result, `ScoringTimeout` when none came in time."""
        return await self.score_job(job_from_fields(query, items, fields), timeout=timeout)

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

        Raises `InvalidJob` before sending a job no worker would accept (or a bad `timeout`),
        `ScoringTimeout` when no result came within `timeout` seconds (the client's default unless
        given; None: no limit), `NotSent` when the job could not be produced, `ClientClosed` when the
        client closed meanwhile, `NotStarted` before `start`."""
        limit = self.timeout if isinstance(timeout, _Default) else checked_timeout(timeout)
        correlation_id = checked_correlation_id(correlation_id) or str(uuid.uuid4())
        job = _addressed(job, correlation_id, limit)
        value = encoded(job, self.format)
        if self._replies is None or self._producer is None:
            raise NotStarted(
                "ScoringClient is not started (or was closed): use `async with` or await start()"
            )
        sent_at_ms = time.time_ns() // 1_000_000
        attempts = SendAttempts.within(limit)
        future = self._replies.expect(correlation_id)
        try:
            return await asyncio.wait_for(
                self._exchange(value, job.id or correlation_id, correlation_id, sent_at_ms, attempts, future),
                limit,
            )
        except TimeoutError:
            job_id = job.id or correlation_id
            if not attempts.acknowledged:  # the broker never took it: not a slow worker
                last = f"; last refusal: {_said(attempts.last_error)}" if attempts.last_error else ""
                reason = f"not acknowledged by the broker within {limit:g}s{last}"
                raise NotSent(job_id, reason) from attempts.last_error
            raise ScoringTimeout(job_id, limit or 0.0) from None
        finally:
            self._replies.forget(correlation_id)

    async def _exchange(
        self,
        value: bytes,
        job_id: str,
        correlation_id: str,
        timestamp_ms: int,
        attempts: SendAttempts,
        future: asyncio.Future[Result],
    ) -> Result:
        headers = [
            (CORRELATION_HEADER, correlation_id.encode()),
            (REPLY_TOPIC_HEADER, self.reply_topic.encode()),
            ("content-type", content_type_of(self.format).encode()),
        ]
        try:
            await attempts.send(
                self._producer,
                self.request_topic,
                value=value,
                key=job_id.encode(),
                headers=headers,
                timestamp_ms=timestamp_ms,
            )
        except Exception as exc:  # e.g. a job larger than the producer's request limit
            raise NotSent(job_id, _said(exc)) from exc
        return await future

    async def _started(self, client: Any) -> Any:
        """Start an aiokafka client and make sure it is stopped, also when start itself fails."""
        self._stack.push_async_callback(_stop, client)
        await client.start()
        return client

    async def _partitions(self, topic: str) -> set[int]:
        """The topic's partitions; on a broker that creates topics on demand this creates it."""
        from kafka_scorer.kafka.errors import UnknownTopicOrPartitionError

        try:
            return await asyncio.wait_for(self._producer.partitions_for(topic), METADATA_WAIT_S)
        except (TimeoutError, UnknownTopicOrPartitionError):
            raise TopicMissing(
                topic,
                f"topic {topic!r} does not exist on {self.settings.bootstrap_servers} and the broker does "
                f"not create topics on demand: create it (kafka-topics.sh --create --topic {topic}) or "
                "name another one",
            ) from None


async def _stop(client: Any) -> None:
    """`client.stop()`, which aiokafka's consumer ends with a stray `CancelledError` when stopped during
    an outage (its fetcher re-raises the cancellation of its own retry sleep); a cancellation of the
    task that closes the client still goes through."""
    try:
        await client.stop()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        # Python 3.10 has no `Task.cancelling()`, so there the stray cancellation cannot be told from a
        # real one: it is raised (swallowing a real one would leave the task running)
        if sys.version_info < (3, 11) or (task is not None and task.cancelling()):
            raise


def _said(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _addressed(job: Job, correlation_id: str, timeout_s: float | None) -> Job:
    """The job as sent: its id (the correlation id when it has none) and a deadline no later than the
    call's own, so the worker knows when its sender stops waiting."""
    if not isinstance(job, Job):
        raise InvalidJob(f"expected a kafka_scorer.wire.protocol.Job, not {type(job).__name__}")
    changes: dict[str, object] = {}
    if job.id is None:
        changes["id"] = correlation_id
    if timeout_s is not None:
        deadline_ms = max(1, math.ceil(timeout_s * 1000))
        if job.timeout_ms is None or (isinstance(job.timeout_ms, int) and job.timeout_ms > deadline_ms):
            changes["timeout_ms"] = deadline_ms
    return msgspec.structs.replace(job, **changes) if changes else job


def _settings(**given: Any) -> Settings:
    """The worker's settings, with the keywords that were given over the environment; a bad one (a
    misspelt keyword, a wrong value) is `InvalidSetting` naming it."""
    from pydantic import ValidationError

    from kafka_scorer.config import Settings
    from kafka_scorer.errors import explain

    for name in given:
        if name not in Settings.model_fields:
            close = difflib.get_close_matches(name, Settings.model_fields, n=1)
            hint = f": did you mean {close[0]}?" if close else " (docs/configuration.md lists them)"
            raise InvalidSetting(name, f"ScoringClient has no setting {name!r}{hint}")
    try:
        return Settings(**{name: value for name, value in given.items() if value is not None})
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0].get("loc") or ("settings",)
        raise InvalidSetting(str(first[0]), explain(exc) or str(exc)) from exc
    except TypeError as exc:
        raise InvalidSetting("settings", str(exc)) from exc
