"""A broker outage as the operator should see it: `/readyz` red while no broker answers, and a few log
lines instead of aiokafka's hundreds.

aiokafka logs every reconnect attempt of every client task at ERROR — the fetcher, the group
coordinator, metadata refreshes — which is about 650 lines in 10 s of a stopped broker, while its
`getmany` quietly returns nothing, so the worker looked ready throughout. Two parts, one concept:

- `ClientNoise`, a filter on the Kafka client's loggers: its connection errors pass at most once a
  minute (as WARNING, saying how many were held back meanwhile), and none pass while the outage is
  known, since `BrokerWatch` then speaks for them.
- `BrokerWatch` asks the cluster for its metadata every few seconds (the request every client task
  needs first). Two failures in a row are an outage: one WARNING, `/readyz` 503, one WARNING a minute
  while it lasts with the count of held-back client lines, and one INFO line when a broker answers
  again. The clients reconnect by themselves; no restart is needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiokafka.errors import KafkaError

log = logging.getLogger(__name__)

_CLIENT = "aiokafka"
_REPEAT_S = 60.0
"""How often a held-back kind of line is shown, and the outage line repeated: one a minute."""
_CHECK_UP_S = 2.0
_CHECK_DOWN_S = 1.0
_PROBE_TIMEOUT_S = 5.0
_FAILURES_FOR_OUTAGE = 2  # one failed request can be a broker restarting a connection; two are not

# What the Kafka client says when it cannot reach a broker (aiokafka 0.14's own wording).
_CONNECTION_MARKS = (
    "Unable connect",
    "Unable to update metadata",
    "Unable to request metadata",
    "NodeNotReadyError",
    "KafkaConnectionError",
    "Connect call failed",
    "coordinator dead",
    "Coordinator Request failed",
    "Heartbeat send request failed",
    "Heartbeat session expired",
)


@dataclass(eq=False)
class ClientNoise(logging.Filter):
    """Holds back the Kafka client's connection errors; counts what it held back."""

    clock: Callable[[], float] = time.monotonic
    quiet: bool = False
    """Set while an outage is known: every client warning and error is held back, only counted."""
    held_back: int = 0
    """Lines held back since `take` was last called."""
    _shown_at: float | None = field(default=None, init=False)
    _loggers: list[logging.Logger] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        super().__init__()

    def filter(self, record: logging.LogRecord) -> bool:
        if not logging.WARNING <= record.levelno < logging.CRITICAL:
            return True
        if not self.quiet and not any(mark in record.getMessage() for mark in _CONNECTION_MARKS):
            return True
        now = self.clock()
        if self.quiet or (self._shown_at is not None and now - self._shown_at < _REPEAT_S):
            self.held_back += 1
            return False
        self._shown_at = now
        suffix = f" ({self.take()} similar lines held back in the last minute)" if self.held_back else ""
        record.msg, record.args = record.getMessage() + suffix, None
        record.levelno, record.levelname = logging.WARNING, "WARNING"  # the worker retries: not an error
        return True

    def take(self) -> int:
        """The count of held-back lines, reset to zero."""
        count, self.held_back = self.held_back, 0
        return count

    def install(self) -> None:
        """On every Kafka client logger (a logger's filter sees only the records it creates itself)."""
        manager = logging.getLogger().manager
        names = [
            name for name in list(manager.loggerDict) if name == _CLIENT or name.startswith(_CLIENT + ".")
        ]
        self._loggers = [logging.getLogger(name) for name in {_CLIENT, *names}]
        for logger in self._loggers:
            logger.addFilter(self)

    def remove(self) -> None:
        for logger in self._loggers:
            logger.removeFilter(self)
        self._loggers = []


@dataclass
class BrokerWatch:
    """`ready` is False while no broker answers a metadata request; the outage gets a few lines."""

    bootstrap_servers: str
    probe: Callable[[], Awaitable[object]]
    """One metadata request to any broker (JobConsumer.cluster_partitions); raises when none answers."""
    noise: ClientNoise = field(default_factory=ClientNoise)
    clock: Callable[[], float] = time.monotonic
    ready: bool = True
    while_down: str = (
        "/readyz answers 503 while it lasts; the worker retries by itself and resumes when a broker "
        "answers (no restart needed). Check the broker, and --bootstrap-servers "
        "(KAFKA_SCORER_BOOTSTRAP_SERVERS)"
    )
    """What the outage line says happens meanwhile and what to check: the worker's words unless given
    (the client, kafka_scorer/client, gives its own)."""
    _failures: int = field(default=0, init=False)
    _down_since: float | None = field(default=None, init=False)
    _said_at: float = field(default=0.0, init=False)

    async def run(self, stop: asyncio.Event) -> None:
        self.noise.install()
        try:
            while not stop.is_set():
                await self.check()
                pause = _CHECK_UP_S if self.ready else _CHECK_DOWN_S
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), pause)
        finally:
            self.noise.remove()

    async def check(self) -> None:
        try:
            await asyncio.wait_for(self.probe(), _PROBE_TIMEOUT_S)
        except (KafkaError, OSError, TimeoutError) as exc:
            self._failed(exc)
            return
        except Exception as exc:  # a readiness check must never become the worker's fatal error
            log.warning("broker check failed (%r); readiness left as it was", exc)
            return
        self._answered()

    def _failed(self, exc: BaseException) -> None:
        self._failures += 1
        now = self.clock()
        if self._down_since is None:
            if self._failures < _FAILURES_FOR_OUTAGE:
                return
            self._down_since, self._said_at = now, now
            self.ready, self.noise.quiet = False, True
            log.warning("Kafka broker %s unreachable (%s): %s", self.bootstrap_servers, exc, self.while_down)
        elif now - self._said_at >= _REPEAT_S:
            self._said_at = now
            log.warning(
                "Kafka broker %s still unreachable after %.0fs (%d Kafka client lines held back)",
                self.bootstrap_servers,
                now - self._down_since,
                self.noise.take(),
            )

    def _answered(self) -> None:
        self._failures = 0
        if self._down_since is None:
            return
        log.info(
            "Kafka broker %s reachable again after %.0fs (%d Kafka client lines held back); resuming",
            self.bootstrap_servers,
            self.clock() - self._down_since,
            self.noise.take(),
        )
        self._down_since, self.ready, self.noise.quiet = None, True, False
