"""What counts as a passing broker problem, and how long to wait before trying again.

Broker outages must never stop the worker or lose work (issue 3, lifecycle): every network call that
can fail while the cluster is away retries with this backoff and logs each attempt.
"""

from __future__ import annotations

import asyncio

from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError, NodeNotReadyError, RequestTimedOutError

UNREACHABLE: tuple[type[BaseException], ...] = (
    KafkaConnectionError,
    NodeNotReadyError,
    RequestTimedOutError,
    KafkaTimeoutError,
    OSError,
)


def is_retriable(exc: BaseException) -> bool:
    return isinstance(exc, UNREACHABLE) or bool(getattr(exc, "retriable", False))


class Backoff:
    """Exponential backoff with a cap: 0.1 s, 0.2 s, ... 5 s; `reset` after a success."""

    def __init__(self, first_s: float = 0.1, cap_s: float = 5.0) -> None:
        self.first_s, self.cap_s, self.next_s = first_s, cap_s, first_s

    async def sleep(self) -> None:
        await asyncio.sleep(self.next_s)
        self.next_s = min(self.cap_s, self.next_s * 2)

    def reset(self) -> None:
        self.next_s = self.first_s
