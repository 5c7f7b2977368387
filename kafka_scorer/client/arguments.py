"""A call's arguments checked before anything is sent: a bad one is `InvalidJob`, never a send.

The job is checked by the worker's own decoder (wire/protocol.py `decode_job`) on the very bytes that
will be produced, so the client accepts exactly what a worker accepts as a well-formed job: a
misspelt field, `priority=500` or a string where token ids belong fails here, at the caller's line,
instead of coming back later as an `invalid_request` result (or, for a type msgspec can encode but
no worker can read, as nothing at all). Checks that need the model (a label that is not one token, an
item too long) stay the worker's: they come back as `JobFailed`.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from kafka_scorer.client.errors import InvalidJob
from kafka_scorer.wire.content import dec_hook
from kafka_scorer.wire.protocol import (
    Job,
    MessageDecodeError,
    WireFormat,
    content_type_of,
    decode_job,
    encode_job,
)


def job_from_fields(query: Any, items: Any, fields: dict[str, Any]) -> Job:
    """`score`'s arguments as a `Job`; unknown keywords and wrong types are `InvalidJob`."""
    try:
        return msgspec.convert({"query": query, "items": items, **fields}, Job, dec_hook=dec_hook)
    except msgspec.ValidationError as exc:
        raise InvalidJob(f"invalid job: {exc}") from exc


def checked_timeout(timeout: Any, what: str = "timeout") -> float | None:
    """A call's timeout in seconds: a positive finite number, or None (no limit)."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise InvalidJob(f"{what} must be seconds (a number) or None, not {timeout!r}")
    if not math.isfinite(timeout) or timeout <= 0:
        raise InvalidJob(f"{what} must be a positive finite number of seconds or None, not {timeout!r}")
    return float(timeout)


def checked_correlation_id(correlation_id: Any) -> str | None:
    if correlation_id is None:
        return None
    if not isinstance(correlation_id, str) or not correlation_id:
        raise InvalidJob(f"correlation_id must be a non-empty string, not {correlation_id!r}")
    return correlation_id


def encoded(job: Any, fmt: WireFormat) -> bytes:
    """The bytes to produce for `job`, after the worker's decoder accepted them."""
    if not isinstance(job, Job):
        raise InvalidJob(f"expected a kafka_scorer.wire.protocol.Job, not {type(job).__name__}")
    try:
        value = encode_job(job, fmt)
    except (TypeError, ValueError, OverflowError) as exc:  # a field holding something no format can carry
        raise InvalidJob(f"invalid job: {exc}") from exc
    try:
        decode_job(value, content_type_of(fmt))
    except MessageDecodeError as exc:
        raise InvalidJob(str(exc)) from exc
    return value
