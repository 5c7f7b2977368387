"""When a job was born and when it expires (SPEC §9), on the worker's own monotonic clock.

A job is born at its record's timestamp: the producer's clock (CreateTime) or the broker's
(LogAppendTime), whichever the topic keeps. Its deadline is that instant plus the job's `timeout_ms`,
or plus `max_job_age_ms` for jobs without one (none when both are unset). Clocks of different machines
disagree, so the rule is one-sided on purpose (docs/message-schema.md, "Deadlines"):
- a timestamp missing (-1) or in the worker's future counts as "received now": a producer clock running
  ahead never expires a job early, it only delays the deadline by that much;
- a producer clock running *behind* the worker's makes its jobs look older by the difference, which
  expires them early by as much: keep clocks synchronised (NTP) when deadlines are tight.

The instant is converted once, at intake, to the monotonic clock the batcher reads, so later checks
need no wall clock (a wall-clock step after intake changes nothing).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TimePolicy:
    max_job_age_ms: int = 0  # 0: jobs without timeout_ms never expire
    topic_priorities: Mapping[str, int] = field(default_factory=dict)

    def priority(self, topic: str, asked: int | None) -> int:
        """The job's own priority, else its topic's default (0 unless configured)."""
        return asked if asked is not None else self.topic_priorities.get(topic, 0)

    def deadline(self, born: float, timeout_ms: int | None) -> float | None:
        """The monotonic instant the job expires, or None when it has no deadline."""
        limit = timeout_ms or self.max_job_age_ms
        return born + limit / 1000 if limit else None


def born_at(timestamp_ms: int | None, now_wall_ms: float | None = None, now: float | None = None) -> float:
    """The monotonic instant of a record's timestamp; a missing or future timestamp is "now"."""
    now_wall_ms = time.time() * 1000 if now_wall_ms is None else now_wall_ms
    now = time.monotonic() if now is None else now
    if timestamp_ms is None or timestamp_ms < 0 or timestamp_ms > now_wall_ms:
        return now
    return now - (now_wall_ms - timestamp_ms) / 1000
