"""Reaching the cluster at `ScoringClient.start`: retry an unreachable broker for as long as the caller
allows (`connect_timeout`), then give up with one typed error.

A web service often starts beside its Kafka (a compose file, a pod restarted with the cluster): a
client that fails in a third of a second on the first refused connection makes the service crash-loop
for nothing. A refused TLS certificate or SASL password never fixes itself, so it is not retried:
the worker's start-up check (kafka/preflight.py) tells the two apart and names the setting.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from kafka_scorer.client.errors import BrokerUnreachable, InvalidSetting
from kafka_scorer.errors import SettingError

if TYPE_CHECKING:
    from kafka_scorer.config import Settings

log = logging.getLogger(__name__)

DEFAULT_CONNECT_TIMEOUT_S = 10.0
_FIRST_RETRY_S, _LAST_RETRY_S = 0.25, 2.0
_PROBE_AT_LEAST_S = 1.0  # one test connection may take this long even when the budget is nearly spent

T = TypeVar("T")


def connect_budget(connect_timeout: float | None) -> float:
    """`connect_timeout` checked: seconds >= 0 (0: one attempt), None: retry for ever."""
    if connect_timeout is None:
        return math.inf
    given = connect_timeout
    if isinstance(given, bool) or not isinstance(given, int | float) or math.isnan(given) or given < 0:
        why = f"connect_timeout must be >= 0 seconds or None, not {given!r}"
        raise InvalidSetting("connect_timeout", why)
    return float(connect_timeout)


async def connect(
    settings: Settings,
    budget_s: float,
    attempt: Callable[[], Awaitable[T]],
    undo: Callable[[], Awaitable[None]],
) -> T:
    """`attempt()` (start the Kafka clients) once a bootstrap server accepts the settings, retried with
    backoff while the broker cannot be reached and `budget_s` lasts; `undo()` cleans up a failed
    attempt. Raises `BrokerUnreachable` when the budget is spent, `InvalidSetting` for a refusal."""
    from kafka_scorer.kafka.preflight import CHECK_TIMEOUT_S, check_connection
    from kafka_scorer.kafka.retry import Backoff, is_retriable

    started = time.monotonic()
    backoff = Backoff(_FIRST_RETRY_S, _LAST_RETRY_S)
    warned = False
    while True:
        reasons: list[str] = []
        try:
            left_s = budget_s - (time.monotonic() - started)
            probe_s = min(CHECK_TIMEOUT_S, max(_PROBE_AT_LEAST_S, left_s))
            if await check_connection(settings, probe_s, unreached=reasons):
                return await attempt()
        except BaseException as exc:
            await undo()  # also for a refusal or a cancellation: no client is left started
            if isinstance(exc, SettingError) and not isinstance(exc, InvalidSetting):
                raise InvalidSetting(exc.setting, str(exc)) from exc
            if not isinstance(exc, Exception) or not is_retriable(exc):
                raise
            reasons.append(f"{type(exc).__name__}: {exc}")
        waited = time.monotonic() - started
        if waited + backoff.next_s > budget_s:
            raise BrokerUnreachable(settings.bootstrap_servers, waited, reasons)
        if not warned:
            warned = True
            log.warning(
                "Kafka broker %s unreachable (%s); the client retries %s",
                settings.bootstrap_servers,
                "; ".join(reasons),
                "until one answers (connect_timeout=None)"
                if math.isinf(budget_s)
                else f"for up to {budget_s:g}s (connect_timeout)",
            )
        await backoff.sleep()
