"""One job that `submit` (and the demo) sends: where it came from, and what became of it.

Its own file because the command and its summary both read it: kept in submit.py, the summary and
the command imported each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kafka_scorer.wire.protocol import Job, Result


@dataclass
class Submission:
    """One job on its way: where it came from, its correlation id, and what became of it."""

    line: int
    job: Job
    correlation_id: str
    sent_at: float | None = None
    result: Result | None = None
    received_at: float | None = None
    send_error: str | None = None

    @property
    def job_id(self) -> str:
        return self.job.id or self.correlation_id

    @property
    def state(self) -> Literal["ok", "failed", "pending"]:
        if self.send_error is not None or (self.result is not None and self.result.error is not None):
            return "failed"
        return "ok" if self.result is not None else "pending"

    @property
    def latency_s(self) -> float | None:
        if self.sent_at is None or self.received_at is None:
            return None
        return self.received_at - self.sent_at
