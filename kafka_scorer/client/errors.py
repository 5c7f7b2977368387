"""What a `ScoringClient` raises: one type per way a caller's wait can end without scores.

Typed so a caller can tell "ask again later" (`ScoringTimeout`, `BrokerUnreachable`) from "this job is
wrong" (`InvalidJob` before it is sent, `JobFailed` with the worker's error code after) from "the
request never left" (`NotSent`) with an `except` clause rather than by reading messages. Every one
derives from `ScoringError`, so `except ScoringError` is the whole contract; each also derives from
the built-in a caller would otherwise expect (`ValueError` for a bad argument, `TimeoutError` for a
timeout, `RuntimeError` for a client used before `start`). Errors at `start` are also the project's
`UserFacingError`, whose message is the one line to print (errors.report). docs/client.md lists them.
"""

from __future__ import annotations

from kafka_scorer.errors import SettingError, UserFacingError, setting_hint
from kafka_scorer.wire.protocol import ErrorCode, Result


class ScoringError(Exception):
    """Base of every error a `ScoringClient` raises."""


class InvalidJob(ScoringError, ValueError):
    """A call's argument is wrong (a misspelt job field, `priority` out of range, a wrong type, a bad
    `timeout`): raised before anything is sent, with the schema's complaint; the cause is chained."""


class InvalidSetting(ScoringError, SettingError, ValueError):
    """A client setting is invalid (at construction) or the broker refused it (at `start`: a TLS
    certificate, a SASL password). `setting` names it; the message is one line and holds no secret."""


class NotStarted(ScoringError, RuntimeError):
    """A call on a client that was never started, or was closed: use `async with` or `await start()`."""


class BrokerUnreachable(ScoringError, UserFacingError):
    """No bootstrap server answered within the client's `connect_timeout` at `start`. `reasons` holds
    one `host:port: why` per server of the last attempt."""

    def __init__(self, bootstrap_servers: str, waited_s: float, reasons: list[str]) -> None:
        why = "; ".join(reasons) or "no answer"
        super().__init__(
            f"cannot reach the Kafka broker at {bootstrap_servers}: check that it is running and set "
            f"{setting_hint('bootstrap_servers')} (tried for {waited_s:.1f}s, the client's "
            f"connect_timeout: {why})"
        )
        self.bootstrap_servers = bootstrap_servers
        self.reasons = reasons


class TopicMissing(ScoringError, UserFacingError):
    """The request or reply topic does not exist and the broker does not create topics on demand."""

    def __init__(self, topic: str, message: str) -> None:
        super().__init__(message)
        self.topic = topic


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
    """The job could not be produced to the request topic: too large for the producer, refused by the
    broker, or not acknowledged before the call's timeout while the broker was away (retriable errors
    are retried until then); the cause is chained."""

    def __init__(self, job_id: str, reason: str) -> None:
        super().__init__(f"job {job_id!r} not sent: {reason}")
        self.job_id = job_id
        self.reason = reason


class ClientClosed(ScoringError):
    """The client was closed, or its reply reader stopped, while the call was waiting; the cause (the
    reader's failure) is chained."""
