"""The rerank request shape (SPEC §10): `documents` in, the texts the engine scores as items out.

Pipelines written against Cohere's, Jina's or TEI's rerank APIs send `documents` — texts, or objects
whose `rank_fields` hold the text — instead of `items`. The preparer turns such a job into the job it
already knows: `items` are the documents' scored texts, in order, so tokenizing, templates, chunking,
truncation and every limit apply unchanged and name a document by its index. The job keeps its
`documents`, which is how the result side (`engine/prepare/ranking.py`) knows to answer with `results` and
what to echo with `return_documents`.

Choices where SPEC is silent (also in docs/message-schema.md):
- an object document without `rank_fields` is scored by its `text` field, the field Cohere and Jina
  read by default;
- several rank fields are joined in the order named, one per line, values only (no field names);
- a rank field's value must be text; a number or a nested object is `invalid_request` naming it,
  never turned into text by a rule the sender cannot see;
- `rank_fields` or `return_documents` on a job that sends `items` is `invalid_request`: they belong
  to the rerank shape, and a token-id job (which has no documents) cannot use them;
- a text document is echoed as `{"text": ...}`, an object as sent, the way Cohere and Jina echo them;
- an object with `content` parts (SPEC §11) is scored by its parts, not by `rank_fields`: a document
  with images is its text and images in order, as vLLM's multimodal documents are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import msgspec

from kafka_scorer.engine.prepare.prepared import InputError, InputLimits
from kafka_scorer.wire.content import Content, content_document
from kafka_scorer.wire.protocol import Document, ErrorCode, Job, shape_problem

DEFAULT_RANK_FIELDS = ("text",)
"""What an object document is scored by when the job names no `rank_fields`."""
FIELD_SEPARATOR = "\n"
"""Between the values of several rank fields in the scored text."""
RANK_FIELDS_IGNORED_WARNING = "rank_fields ignored: every document is a text, none an object"


def is_rerank(job: Job) -> bool:
    """Whether the job came in the rerank shape (its result then carries `results`)."""
    return job.documents is not msgspec.UNSET


def item_list(job: Job) -> list[str | list[int]]:
    """The items of a job `as_items` returned; `InputError` (`invalid_request`) for a job with none.

    Texts or token ids: a job with content parts never reaches a text kind's preparer (the engine's
    `prepare` answers it `unsupported`), and the vision kind reads its items as they are."""
    if job.items is msgspec.UNSET:
        raise InputError(ErrorCode.INVALID_REQUEST, "items: missing; send `items` or `documents`")
    return cast("list[str | list[int]]", job.items)


def as_items(job: Job) -> Job:
    """The job with `items` set to its documents' scored texts (a job of `items` as it is).

    Raises `InputError` (`invalid_request`) for every rerank field the job cannot use: both or neither
    of `items` and `documents`, a token-id query beside documents, an empty `rank_fields`, a document
    missing a rank field or holding a non-text value there, or a rerank-only field on an `items` job.
    """
    problem = shape_problem(job)
    if problem is not None:
        raise InputError(ErrorCode.INVALID_REQUEST, problem)
    if not is_rerank(job):
        for name in ("rank_fields", "return_documents"):
            if getattr(job, name) not in (None, False):
                raise InputError(
                    ErrorCode.INVALID_REQUEST,
                    f"{name}: applies to `documents` (the rerank shape); this job sends `items`. Send "
                    f"the texts as `documents`, or leave {name} out",
                )
        return job
    if not isinstance(job.query, str | Content):
        raise InputError(
            ErrorCode.INVALID_REQUEST,
            "documents are texts or objects, but the query is token ids: send token-id inputs as `items`",
        )
    fields = DEFAULT_RANK_FIELDS if job.rank_fields is None else tuple(job.rank_fields)
    if not fields:
        raise InputError(ErrorCode.INVALID_REQUEST, "rank_fields: name at least one field (or leave it out)")
    documents = job.documents if job.documents is not msgspec.UNSET else []
    texts = [_scored_text(index, document, fields) for index, document in enumerate(documents)]
    return msgspec.structs.replace(job, items=texts)


def _scored_text(index: int, document: Document, fields: tuple[str, ...]) -> str | Content:
    """A document's scored text, or its content parts (SPEC §11) when it carries `content`."""
    if isinstance(document, str):
        return document
    try:
        parts = content_document(document)
    except ValueError as exc:
        raise InputError(ErrorCode.INVALID_REQUEST, f"document {index}: {exc}", item=index) from None
    if parts is not None:
        return parts
    values = []
    for name in fields:
        if name not in document:
            raise InputError(
                ErrorCode.INVALID_REQUEST,
                f"document {index}: no field {name!r} (rank_fields: {list(fields)}; without rank_fields "
                f"an object document is scored by its {DEFAULT_RANK_FIELDS[0]!r} field)",
                item=index,
            )
        value = document[name]
        if not isinstance(value, str):
            raise InputError(
                ErrorCode.INVALID_REQUEST,
                f"document {index}: field {name!r} is {type(value).__name__}, not text; a rank field "
                "holds the text to score",
                item=index,
            )
        values.append(value)
    return FIELD_SEPARATOR.join(values)


def all_texts(job: Job) -> bool:
    """Whether every document is a text (then `rank_fields` has nothing to choose from)."""
    return job.documents is not msgspec.UNSET and all(isinstance(document, str) for document in job.documents)


def rank_fields_warnings(job: Job) -> list[str]:
    """`rank_fields` beside text documents only has nothing to choose from: the job is scored, and its
    `warnings` say the field went unused (every kind's preparer adds these to its warnings)."""
    return [RANK_FIELDS_IGNORED_WARNING] if job.rank_fields is not None and all_texts(job) else []


def echo(document: Document) -> dict[str, Any]:
    """A document as its `results` entry carries it: an object as sent, a text as `{"text": ...}`."""
    return {"text": document} if isinstance(document, str) else document


def items_argument(items: str | Sequence[str] | Sequence[list[int]]) -> list:
    """`Scorer.score`'s `items`: one string is one item; a flat list of ints is ambiguous (one item?
    many?), so it is refused."""
    if isinstance(items, str):
        return [items]
    out = list(items)
    if any(isinstance(item, int) for item in out):
        raise TypeError("items: token-id items are lists of ints; pass [ids] for a single item")
    return out


def first_checks(job: Job, served: str, limits: InputLimits) -> Job:
    """What every kind's preparer checks before anything else, the same way: a job for another model
    is answered as such; the rerank shape's documents become items (SPEC §10); no more of them than
    `max_items_per_job`, counted before any text is tokenized or image decoded."""
    if job.model is not None and job.model != served:
        raise InputError(
            ErrorCode.MODEL_MISMATCH, f"job asks for model {job.model!r}; this worker serves {served!r}"
        )
    job = as_items(job)
    count = len(item_list(job))
    if count > limits.max_items_per_job:
        raise InputError(
            ErrorCode.TOO_LONG, f"{count} items; the limit is max_items_per_job={limits.max_items_per_job}"
        )
    return job
