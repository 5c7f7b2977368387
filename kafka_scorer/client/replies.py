"""The reply side of request-reply: one consumer reads the reply topic and wakes the call waiting on
each result's correlation id.

It assigns every partition of the reply topic at its end offset *before* the first job is produced,
so no result can slip past and no result of an earlier run is read; no consumer group is created on
the cluster. Results nobody here waits for (other clients' on a shared reply topic, a duplicate after a
worker's redelivery) are skipped.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgspec

from kafka_scorer.client.errors import ClientClosed
from kafka_scorer.wire.protocol import Result, decode_result

log = logging.getLogger(__name__)

CORRELATION_HEADER = "correlation_id"
_POLL_MS = 200


class ReplyListener:
    """Correlation id -> the future of the call waiting for it, filled from the reply topic."""

    def __init__(self, consumer: Any, topic: str) -> None:
        self._consumer = consumer
        self.topic = topic
        self._waiting: dict[str, asyncio.Future[Result]] = {}
        self._failure: BaseException | None = None

    async def listen_from_end(self, partitions: set[int]) -> None:
        """Assign every partition at its current end; call before the first job is produced."""
        from aiokafka import TopicPartition

        tps = [TopicPartition(self.topic, p) for p in sorted(partitions)]
        self._consumer.assign(tps)
        for tp, offset in (await self._consumer.end_offsets(tps)).items():
            self._consumer.seek(tp, offset)

    def expect(self, correlation_id: str) -> asyncio.Future[Result]:
        """The future that the result with this correlation id will complete."""
        if self._failure is not None:
            raise ClientClosed(f"the reply reader stopped: {self._failure!r}") from self._failure
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._waiting[correlation_id] = future
        return future

    def forget(self, correlation_id: str) -> None:
        """The call stopped waiting (answered, timed out or cancelled)."""
        self._waiting.pop(correlation_id, None)

    async def run(self) -> None:
        """Read until cancelled; a failure of the consumer ends every waiting call with it."""
        try:
            while True:
                batches = await self._consumer.getmany(timeout_ms=_POLL_MS)
                for records in batches.values():
                    for record in records:
                        self._deliver(record)
        except asyncio.CancelledError:
            self.fail(ClientClosed("the client was closed while waiting for a result"))
            raise
        except Exception as exc:
            log.error("reply reader on %s stopped: %r", self.topic, exc)
            self.fail(exc)
            raise

    def fail(self, exc: BaseException) -> None:
        """End every waiting call with `exc`; later calls fail at once."""
        self._failure = self._failure or exc
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(exc)
        self._waiting.clear()

    def _deliver(self, record: Any) -> None:
        headers = dict(record.headers or ())
        correlation_id = headers.get(CORRELATION_HEADER, b"").decode("utf-8", "replace")
        future = self._waiting.get(correlation_id)
        if future is None or future.done() or record.value is None:
            return
        content_type = headers.get("content-type")
        try:
            result = decode_result(record.value, content_type.decode() if content_type else None)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            log.warning("undecodable result for correlation id %s: %s", correlation_id, exc)
            return
        future.set_result(result)
