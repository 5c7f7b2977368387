"""Producing a job: retried through a short broker outage, within the call's own deadline.

While the broker is away (a restart, a leader moving) aiokafka fails a send at once with a retriable
error (`NodeNotReadyError`, `KafkaConnectionError`, ...); a call that gives up on the first one fails
although the broker is back a second later. So a send is retried with a short backoff until it is
acknowledged or the call's time is up, and only then reported as `NotSent` with the last refusal.
A refusal that never fixes itself (a record over the producer's size limit) is `NotSent` at once.

`UnknownError` is retried too: it is what the embedded broker (tansu) answers while a restarted broker
has not yet re-created its topics (docs/worker.md, "The embedded brokers"). A retried send that the
broker did store after all is a duplicate job: the worker answers it twice and the client takes the
first answer (at-least-once, as every Kafka producer without idempotence).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

NO_DEADLINE_RETRY_S = 60.0
"""How long a call without a timeout retries its send before `NotSent`."""
_FIRST_RETRY_S, _LAST_RETRY_S = 0.1, 1.0


def retriable(exc: BaseException) -> bool:
    from kafka_scorer.kafka.errors import UnknownError
    from kafka_scorer.kafka.retry import is_retriable

    return is_retriable(exc) or isinstance(exc, UnknownError)


def _backoff() -> Any:
    from kafka_scorer.kafka.retry import Backoff

    return Backoff(_FIRST_RETRY_S, _LAST_RETRY_S)


@dataclass
class SendAttempts:
    """One call's send, retried; `last_error` is what the broker said last, for `NotSent`."""

    deadline: float
    """time.monotonic() after which no attempt starts (the call's deadline, or NO_DEADLINE_RETRY_S)."""
    last_error: BaseException | None = None
    acknowledged: bool = False
    _backoff: Any = field(default_factory=lambda: _backoff())

    @classmethod
    def within(cls, timeout_s: float | None) -> SendAttempts:
        budget = NO_DEADLINE_RETRY_S if timeout_s is None or math.isinf(timeout_s) else timeout_s
        return cls(time.monotonic() + budget)

    async def send(self, producer: Any, topic: str, **record: Any) -> None:
        """Produce and wait for the acknowledgement; raises the last error once retrying is over."""
        while True:
            try:
                delivery = await producer.send(topic, **record)
                await delivery
            except Exception as exc:
                if not retriable(exc) or time.monotonic() + self._backoff.next_s >= self.deadline:
                    raise
                if self.last_error is None:
                    log.debug("send to %s refused (%r); retrying until the call's deadline", topic, exc)
                self.last_error = exc
                await self._backoff.sleep()
                continue
            self.acknowledged = True
            return
