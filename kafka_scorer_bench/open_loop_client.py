"""The open-loop bench's client: Poisson sends, one reader of the reply topic, and each rate's figures.

Latency is measured from a request's scheduled arrival, not from when the client got round to sending
it: should the client fall behind its schedule, that delay counts against the figures (as it would for a
real caller) instead of hiding a saturated worker; the client's worst lag is reported beside them.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kafka_scorer.wire.protocol import decode_result


class Replies:
    """Every reply read from the reply topic: when it was read, and its error, if any."""

    def __init__(self, consumer) -> None:
        self.consumer = consumer
        self.at: dict[str, float] = {}
        self.errors: dict[str, str] = {}

    async def read_forever(self) -> None:
        while True:
            batch = await self.consumer.getmany(timeout_ms=50)
            now = time.perf_counter()
            for records in batch.values():
                for record in records:
                    result = decode_result(record.value)
                    if result.id in self.at:
                        continue  # a redelivered duplicate (at-least-once)
                    self.at[result.id] = now
                    if result.error is not None:
                        self.errors[result.id] = f"{result.error.code.value}: {result.error.message}"

    async def wait_for(
        self,
        ids: Sequence[str],
        timeout_s: float,
        check: Callable[[], None],
        raise_on_timeout: bool = True,
    ) -> bool:
        """True once every id is answered; False (or an error) after `timeout_s`. `check` raises
        should the worker be gone, so a crash is reported at once, not after the timeout."""
        deadline = time.monotonic() + timeout_s
        while not all(i in self.at for i in ids):
            check()
            if time.monotonic() > deadline:
                if raise_on_timeout:
                    missing = sum(1 for i in ids if i not in self.at)
                    raise RuntimeError(
                        f"the worker left {missing} of {len(ids)} jobs unanswered in {timeout_s:.0f} s"
                    )
                return False
            await asyncio.sleep(0.02)
        return True


@dataclass
class RateRun:
    """One rate's requests: ids, scheduled arrivals (perf_counter) and the worst send lag."""

    start: float
    """When the rate's arrivals began (perf_counter); its first request arrives at a random offset."""
    ids: list[str]
    arrived: list[float]
    lag_max_s: float
    send_failures: int

    def summary(self, rate: float, seconds: float, items: int, replies: Replies, bound_ms: float) -> dict:
        answered = [i for i in self.ids if i in replies.at]
        latencies = sorted(
            (replies.at[i] - t) * 1000 for i, t in zip(self.ids, self.arrived) if i in replies.at
        )
        errors = [i for i in answered if i in replies.errors]
        scored = len(answered) - len(errors)
        lost = len(self.ids) - len(answered)
        # Served over the rate's whole span of arrivals, or longer while a backlog drains: under
        # capacity it equals the offered rate (minus the last answers' latency), over it the capacity.
        last = max((replies.at[i] for i in answered), default=self.start)
        served_s = max(last - self.start, seconds)
        p = {q: percentile(latencies, q) for q in (50, 90, 99, 100)}
        failed = len(errors) + lost + self.send_failures
        return {
            "rate_rps": rate,
            "requests": len(self.ids),
            "offered_items_per_s": len(self.ids) * items / seconds,
            "served_items_per_s": scored * items / served_s,
            "p50_ms": p[50],
            "p90_ms": p[90],
            "p99_ms": p[99],
            "max_ms": p[100],
            "errors": failed,
            "lost": lost,
            "first_error": replies.errors[errors[0]] if errors else ("no reply" if lost else None),
            "client_lag_max_ms": self.lag_max_s * 1000,
            "meets_bound": failed == 0 and p[99] is not None and p[99] <= bound_ms,
            "skipped": False,
        }

    @staticmethod
    def skipped(rate: float, items: int, saturated_at: float) -> dict:
        nan = None  # not measured
        return {
            "rate_rps": rate,
            "requests": 0,
            "offered_items_per_s": rate * items,
            "served_items_per_s": nan,
            "p50_ms": nan,
            "p90_ms": nan,
            "p99_ms": nan,
            "max_ms": nan,
            "errors": 0,
            "lost": 0,
            "first_error": f"skipped: the worker was saturated at {saturated_at:g}/s",
            "client_lag_max_ms": nan,
            "others_cpu": nan,
            "meets_bound": False,
            "skipped": True,
        }


async def send_poisson(
    producer, topic: str, payloads: list[tuple[str, bytes]], offsets: Sequence[float]
) -> RateRun:
    """Produce each payload at its arrival offset from now, whatever has been answered (open loop)."""
    start = time.perf_counter()
    arrived, pending = [], []
    lag = 0.0
    for (_job_id, payload), offset in zip(payloads, offsets, strict=True):
        due = start + offset
        wait = due - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        lag = max(lag, time.perf_counter() - due)
        arrived.append(due)
        pending.append(await producer.send(topic, payload))
    outcomes = await asyncio.gather(*pending, return_exceptions=True)
    failures = sum(1 for o in outcomes if isinstance(o, BaseException))
    return RateRun(start, [job_id for job_id, _ in payloads], arrived, lag, failures)


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of an ascending list (q in 0..100); None for an empty one."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]
