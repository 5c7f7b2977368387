"""The calls waiting for a result, each by its correlation id, and the records that answer them.

Results nobody here waits for (other clients' on a shared reply topic, a duplicate after a worker's
redelivery, a record read again after a log reset) are skipped. A failure of the reply reader ends
every waiting call with `ClientClosed`, the failure chained, and so does closing the client.
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


class ReplyListener:
    """Correlation id -> the future of the call waiting for it."""

    def __init__(self) -> None:
        self._waiting: dict[str, asyncio.Future[Result]] = {}
        self._failure: ClientClosed | None = None

    def expect(self, correlation_id: str) -> asyncio.Future[Result]:
        """The future that the result with this correlation id will complete."""
        if self._failure is not None:
            raise ClientClosed(str(self._failure)) from self._failure.__cause__
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._waiting[correlation_id] = future
        return future

    def forget(self, correlation_id: str) -> None:
        """The call stopped waiting (answered, timed out or cancelled)."""
        self._waiting.pop(correlation_id, None)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def fail(self, failure: ClientClosed) -> None:
        """End every waiting call with `failure`; later calls fail at once."""
        self._failure = self._failure or failure
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(failure)
        self._waiting.clear()

    def deliver(self, record: Any) -> None:
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
