"""What a `ScoringClient` call raises: one type per way a caller's wait can end without scores.

Typed so a caller can tell "ask again later" (`ScoringTimeout`) from "this job is wrong"
(`JobFailed`, with the worker's error code) from "the request never left" (`NotSent`) with an
`except` clause rather than by reading messages. All derive from `ScoringError`.
"""

from __future__ import annotations

from kafka_scorer.wire.protocol import ErrorCode, Result


class ScoringError(Exception):
    """Base of every error a `ScoringClient` call raises."""


class ScoringTimeout(ScoringError, TimeoutError):
    """No result arrived before the call's timeout. The job carried `timeout_ms` ending at the same
    instant, so a worker need not compute what nobody waits for any more."""

    def __init__(self, job_id: str, timeout_s: float) -> None:
        super().__init__(f"no result for job {job_id!r} within {timeout_s:g}s")
        self.job_id = job_id
        self.timeout_s = timeout_s


class JobFailed(ScoringError):
    """The worker answered the job with an error result (`score` and `score_job` raise it; `request`
    returns the result instead). `result` is the whole reply, `code` its error code."""

    def __init__(self, result: Result) -> None:
        assert result.error is not None
        super().__init__(f"job {result.id!r} failed: {result.error.code.value}: {result.error.message}")
        self.result = result
        self.code: ErrorCode = result.error.code
        self.message = result.error.message


class NotSent(ScoringError):
    """The job could not be produced to the request topic (too large for the producer, a broker that
    refused it); the cause is chained."""

    def __init__(self, job_id: str, reason: str) -> None:
        super().__init__(f"job {job_id!r} not sent: {reason}")
        self.job_id = job_id
        self.reason = reason


class ClientClosed(ScoringError):
    """The client was closed, or its reply reader stopped, while the call was waiting."""
