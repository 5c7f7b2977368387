"""Whether a job carries content parts (SPEC §11), and the answer of a kind that reads no images.

Every job shape works on every kind or is refused with a typed error: a model that reads text only
answers a job with content parts `unsupported`, the same code a classification field sent to the
wrong kind gets, instead of scoring a document without its picture or failing inside the tokenizer.
"""

from __future__ import annotations

import msgspec

from kafka_scorer.wire.content import has_content
from kafka_scorer.wire.protocol import ErrorCode, Job, Result, error_result


def carries_content(job: Job) -> bool:
    """Whether the query, an item or a document is made of content parts (text and images)."""
    inputs: list[object] = [job.query]
    if job.items is not msgspec.UNSET:
        inputs += job.items
    if job.documents is not msgspec.UNSET:
        inputs += job.documents
    return any(has_content(value) for value in inputs)


def content_refused(job_id: str, model_name: str) -> Result:
    """The answer of a text-only model to a job with content parts."""
    return error_result(
        job_id,
        ErrorCode.UNSUPPORTED,
        f"content parts (images) need a vision-language model; {model_name!r} reads text only: send "
        "text as strings, or send the job to a worker serving a vision-language reranker",
        model=model_name,
    )
