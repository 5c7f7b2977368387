"""Seeing, from the fetch responses alone, that a partition's log was reset under the worker.

A broker that lost its data, or a topic deleted and recreated, restarts the log at offset 0 while the
worker still holds its old position. Two signs can show it in the numbers the client sees:
- the position is beyond the log end (the fetch response's high watermark);
- the log end moved backwards: a healthy log only grows.
Either must be seen in two fetch responses in a row before it counts, so one odd response (a
leader's high watermark that lags for a moment) does not throw away a position. Then the position
must come from the broker (consumer.py: its committed offset, else `auto_offset_reset`).

What the numbers cannot show: a fresh log that producers filled past the old position before the
worker's next fetch looks like the old one, grown. That case is caught by the group membership the
same broker restart took away (fenced_commit.py); a topic recreated under a group that survives it
needs the topic id (KIP-516), which aiokafka 0.14 neither requests (Metadata v5) nor exposes. The log
start offset would be a third sign, but aiokafka drops it from the fetch response.

Pure Python, no Kafka client: unit-tested in tests/worker/test_log_reset_watch.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

P = TypeVar("P")  # a partition key: aiokafka's TopicPartition in the worker, anything hashable in tests


@dataclass(frozen=True, slots=True)
class FetchState:
    """A partition as the last fetch response left it."""

    position: int
    log_end: int  # the response's high watermark
    fetched_at: int  # aiokafka's timestamp of that response: two states with one are one response


class LogResetWatch(Generic[P]):
    """The highest log end seen per partition, and partitions whose log looks reset, awaiting proof."""

    def __init__(self) -> None:
        self._highest: dict[P, int] = {}
        self._suspects: dict[P, int] = {}  # partition -> the fetch response that first showed it

    def observe(self, states: Mapping[P, FetchState]) -> dict[P, str]:
        """Partitions whose reset two fetch responses in a row confirm, each with why; their highest
        log end restarts from the new log."""
        confirmed: dict[P, str] = {}
        for tp, state in states.items():
            reason = self._anomaly(tp, state)
            if reason is None:
                self._suspects.pop(tp, None)
                self._highest[tp] = max(self._highest.get(tp, state.log_end), state.log_end)
                continue
            first_seen_at = self._suspects.get(tp)
            if first_seen_at is None or first_seen_at == state.fetched_at:
                self._suspects[tp] = state.fetched_at
                continue
            del self._suspects[tp]
            self._highest[tp] = state.log_end
            confirmed[tp] = reason
        return confirmed

    def forget(self, partitions: Iterable[P]) -> None:
        """A new assignment of these partitions: their positions come from the broker anyway."""
        for tp in partitions:
            self._highest.pop(tp, None)
            self._suspects.pop(tp, None)

    def _anomaly(self, tp: P, state: FetchState) -> str | None:
        if state.position > state.log_end:
            return f"position {state.position} is beyond the log end {state.log_end}"
        highest = self._highest.get(tp)
        if highest is not None and state.log_end < highest:
            return f"the log end moved back from {highest} to {state.log_end}"
        return None
