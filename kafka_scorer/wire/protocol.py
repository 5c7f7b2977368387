"""Wire structs of SPEC §2/§3 and their JSON / MessagePack codecs.

Everything that crosses Kafka is decoded here, once, into typed structs; the rest of the code never
sees a dict. Decoders and encoders are built once at import because msgspec compiles a struct's
schema on first use and the hot path should not pay for that per record.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, ClassVar, Literal

import msgspec

from kafka_scorer.wire.content import Content, dec_hook, enc_hook

CONTENT_TYPE_JSON = "application/json"
CONTENT_TYPE_MSGPACK = "application/msgpack"

WireFormat = Literal["json", "msgpack"]
TensorDType = Literal["float32", "float16", "bfloat16"]
Activation = Literal["none", "softmax", "sigmoid"]
Aggregate = Literal["max", "mean", "first"]
NonNegative = Annotated[int, msgspec.Meta(ge=0)]
TimeoutMs = Annotated[int, msgspec.Meta(gt=0)]
Priority = Annotated[int, msgspec.Meta(ge=-128, le=127)]
"""SPEC §9 `priority`: a small int, higher first; out of this range a job is `invalid_request`."""
Positive = Annotated[int, msgspec.Meta(ge=1)]


class ErrorCode(str, enum.Enum):
    """SPEC §3 error codes; a job with an error still gets a result."""

    INVALID_MESSAGE = "invalid_message"
    INVALID_REQUEST = "invalid_request"
    TOO_LONG = "too_long"
    UNSUPPORTED = "unsupported"
    MODEL_MISMATCH = "model_mismatch"
    INTERNAL = "internal"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    """SPEC §9: the job expired (record timestamp + `timeout_ms`) before its forward pass started."""


class Tensor(msgspec.Struct, frozen=True):
    """Row-major little-endian tensor; `data` is raw bytes in MessagePack, base64 in JSON."""

    dtype: TensorDType
    shape: list[int]
    data: bytes


class ErrorInfo(msgspec.Struct, omit_defaults=True):
    code: ErrorCode
    message: str
    item: int | None = None


class Chunking(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """SPEC §9: how an item too long for one pair is split into windows and its row chosen.

    `window` counts the item's own tokens (null: as many as fit the pair limit beside the query and
    the template); consecutive windows share `overlap` tokens. docs/message-schema.md has the rule.
    """

    window: Positive | None = None
    overlap: NonNegative = 0
    aggregate: Aggregate = "max"


Document = str | dict[str, Any]
"""SPEC §10: a document of the rerank shape, a text or an object whose `rank_fields` are scored; an
object with `content` parts (SPEC §11, wire/content.py) is a document with images."""
Input = str | list[int] | Content
"""A query or an item: text, token ids, or content parts (text and images, SPEC §11)."""


class Job(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """One scoring request (SPEC §2). Field names follow SGLang's /v1/score.

    Encoded without the fields left at their default, so a job carries only what its sender set: a
    job that uses no newer field reads the same to a worker that predates it. A job sends `items` or,
    in the rerank shape of Cohere / Jina / TEI (SPEC §10), `documents`: exactly one of them, which the
    decoder checks and `json_schema_extra` says to schema readers (wire/documents.py).
    """

    json_schema_extra: ClassVar[dict[str, Any]] = {
        "oneOf": [{"required": ["items"]}, {"required": ["documents"]}]
    }

    query: Input
    items: list[Input] | msgspec.UnsetType = msgspec.UNSET
    """Required unless the job sends `documents`; the engine fills it from them (wire/documents.py)."""
    id: str | None = None
    label_token_ids: list[int] | None = None
    apply_softmax: bool = False
    item_first: bool = False
    return_pooled_hidden_states: bool = False
    multi_item: bool | None = None
    model: str | None = None
    truncate: bool | None = None
    """SPEC §8: cut an item too long for the pair limit from its end; null: the worker's `truncate`."""
    label_tokens: list[str] | None = None
    """SPEC §8: labels by text, each exactly one token of the served tokenizer."""
    instruction: str | None = None
    """SPEC §8: fills the served template's `{instruction}`; null: the template's own."""
    top_n: NonNegative | None = None
    """SPEC §8: when set, the result carries `ranking`, the best `top_n` items."""
    rank_by: NonNegative | None = None
    """SPEC §8: the label (CausalLM) or class (classification) whose score ranks the items."""
    activation: Activation | None = None
    """SPEC §8: classification only; null means `softmax` with `apply_softmax`, else `none`."""
    timeout_ms: TimeoutMs | None = None
    """SPEC §9: the job expires at its record's timestamp + `timeout_ms`; null: the worker's default."""
    priority: Priority | None = None
    """SPEC §9: higher first; null: the request topic's default priority (0 unless set)."""
    chunking: Chunking | None = None
    """SPEC §9: score every window of a long item; null: the worker's `chunking`. Not with `truncate`."""
    documents: list[Document] | msgspec.UnsetType = msgspec.UNSET
    """SPEC §10: the rerank shape's texts or objects to score, instead of `items`."""
    rank_fields: list[str] | None = None
    """SPEC §10: the fields of object documents joined (in order) into the scored text; null: `text`."""
    return_documents: bool = False
    """SPEC §10: echo each document in its `results` entry."""

    @property
    def inputs(self) -> list[Any]:
        """What the job scores: its `items`, or its `documents` in the rerank shape ([] with neither)."""
        if self.items is not msgspec.UNSET:
            return self.items
        return self.documents if self.documents is not msgspec.UNSET else []


class Ranked(msgspec.Struct, frozen=True):
    """One entry of a result's `ranking`: the item's index in `items` and its relevance score."""

    index: int
    score: float


class Reranked(msgspec.Struct, frozen=True, omit_defaults=True):
    """One entry of a rerank-shaped result's `results` (SPEC §10): the document's index in
    `documents`, its relevance score, and (with `return_documents`) the document: an object as sent,
    a text as `{"text": ...}`, the way Cohere and Jina echo it."""

    index: int
    relevance_score: float
    document: dict[str, Any] | None = None


class ChunkedItem(msgspec.Struct, frozen=True, omit_defaults=True):
    """One entry of a result's `chunks`: an item that was scored as several windows.

    `window` is the window whose row the item got (`max`: the winner, `first`: 0; absent for `mean`,
    whose row is every window's) and `span` that window's [start, end) in the item, counted in `unit`:
    token offsets for token-id items, character offsets into the text for text items.
    """

    index: int
    windows: int
    unit: Literal["tokens", "characters"]
    window: int | None = None
    span: tuple[int, int] | None = None


class TemplateRef(msgspec.Struct, frozen=True):
    """Which prompt template produced a result: its name and a short hash of its text."""

    name: str
    hash: str


class Result(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One reply per job (SPEC §3). `scores` is null exactly when `error` is set.

    `warnings` is an addition to SPEC §3: it tells a caller that a field it sent was ignored (for
    example `label_token_ids` sent to a classification model) instead of dropping it silently.
    """

    id: str
    scores: list[list[float]] | None
    prompt_tokens: int = 0
    """Prompt tokens run through the model for this job (those served from the prefix cache excluded)."""
    model: str = ""
    pooled_hidden_states: Tensor | None = None
    error: ErrorInfo | None = None
    warnings: list[str] = msgspec.field(default_factory=list)
    truncated_items: list[int] = msgspec.field(default_factory=list)
    """SPEC §8: indices of the items cut to fit the pair limit (omitted when empty)."""
    ranking: list[Ranked] | None = None
    """SPEC §8: the best `top_n` items, highest relevance first, ties by lower index."""
    model_revision: str = ""
    """Provenance: a hash of the served checkpoint's config, weight and tokenizer files."""
    template: TemplateRef | None = None
    """Provenance: the prompt template applied to this job's text, if any."""
    dtype: str = ""
    """Provenance: the dtype the model ran in."""
    chunks: list[ChunkedItem] = msgspec.field(default_factory=list)
    """SPEC §9: the items scored as several windows (omitted when none was)."""
    cached_tokens: int = 0
    """Prompt tokens served from the worker's prefix cache instead of run through the model (SPEC §9)."""
    results: list[Reranked] | None = None
    """SPEC §10: for a job in the rerank shape (`documents`), instead of `ranking`: every document (or
    the best `top_n`) by relevance, highest first, ties by lower index."""

    @property
    def ok(self) -> bool:
        return self.error is None


def error_result(
    job_id: str, code: ErrorCode, message: str, *, model: str = "", item: int | None = None
) -> Result:
    return Result(id=job_id, scores=None, model=model, error=ErrorInfo(code=code, message=message, item=item))


class MessageDecodeError(ValueError):
    """The record's value could not be turned into a Job.

    `code` separates bytes that are not JSON/MessagePack at all (`invalid_message`, dead-lettered) from
    a well-formed document that breaks the schema (`invalid_request`). `job_id` is the document's own
    `id` when one could still be read, so the caller can correlate the error reply; `fmt` the format
    such a document parsed as (past any registry framing), which its error reply takes.
    """

    def __init__(
        self, code: ErrorCode, message: str, job_id: str | None = None, fmt: WireFormat | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.job_id = job_id
        self.fmt = fmt


class _IdOnly(msgspec.Struct):
    id: str | None = None


_MSGPACK_MAP_MARKERS = frozenset(range(0x80, 0x90)) | {0xDE, 0xDF}  # fixmap, map16, map32
_JSON_JOB_DECODER = msgspec.json.Decoder(Job, dec_hook=dec_hook)
_MSGPACK_JOB_DECODER = msgspec.msgpack.Decoder(Job, dec_hook=dec_hook)
_JSON_ID_DECODER = msgspec.json.Decoder(_IdOnly)
_MSGPACK_ID_DECODER = msgspec.msgpack.Decoder(_IdOnly)
_JSON_UNTYPED_DECODER = msgspec.json.Decoder(float_hook=str)
_MSGPACK_UNTYPED_DECODER = msgspec.msgpack.Decoder()
_JSON_ENCODER = msgspec.json.Encoder(enc_hook=enc_hook)
_MSGPACK_ENCODER = msgspec.msgpack.Encoder(enc_hook=enc_hook)


def named_format(content_type: str | None) -> WireFormat | None:
    """The format a content-type header names; None for no header or one naming neither (`text/plain`)."""
    if not content_type:
        return None
    ct = content_type.split(";", 1)[0].strip().lower()
    if ct in (CONTENT_TYPE_MSGPACK, "application/x-msgpack", "application/vnd.msgpack"):
        return "msgpack"
    if ct == CONTENT_TYPE_JSON or ct.endswith("+json"):
        return "json"
    return None


def sniff_format(value: bytes, content_type: str | None) -> WireFormat:
    """Header first (SPEC §2), then the first byte: JSON objects start with `{` (after blanks)."""
    named = named_format(content_type)
    if named is not None:
        return named
    stripped = value.lstrip()
    return "json" if stripped[:1] in (b"{", b"[") else "msgpack"


def unframe(value: bytes) -> bytes:
    """The payload of a record in Confluent Schema Registry framing (a zero magic byte, a 4-byte
    big-endian schema id, then the serialized value), else the value itself.

    Producers using a registry's JSON Schema serializer frame every record this way. No job can begin
    with a zero byte (JSON cannot; in MessagePack it is the integer 0, never a map), so the framing is
    recognised without asking a registry; a JSON or MessagePack payload needs no schema to be read, so
    the id is dropped. Payloads of other formats (Avro, Protobuf) then fail to decode: `invalid_message`.
    """
    if len(value) >= 5 and value[0] == 0:
        return value[5:]
    return value


def decode_job(value: bytes | None, content_type: str | None = None) -> tuple[Job, WireFormat]:
    """Bytes -> a Job, or a `MessageDecodeError` whose code says which kind of bad it is; nothing else.

    Any byte string can arrive, so every exception a decoder raises is classified here: msgspec also
    raises `UnicodeDecodeError` (invalid UTF-8 inside a string) and `RecursionError` (nesting deeper
    than about a thousand levels), and those bytes are as undecodable as a syntax error.
    """
    if value is None:
        raise MessageDecodeError(ErrorCode.INVALID_MESSAGE, "record has no value (tombstone)")
    value = unframe(value)
    fmt = sniff_format(value, content_type)
    if content_type is None and fmt == "msgpack" and value[:1] and value[0] not in _MSGPACK_MAP_MARKERS:
        # Sniffed, not declared: almost any byte string "decodes" as some MessagePack scalar, so plain
        # text without a content-type is undecodable, not a schema violation.
        raise MessageDecodeError(ErrorCode.INVALID_MESSAGE, "neither a JSON object nor a MessagePack map")
    decoder = _JSON_JOB_DECODER if fmt == "json" else _MSGPACK_JOB_DECODER
    try:
        job = decoder.decode(value)
    except msgspec.ValidationError as exc:
        # The typed decoder stops at the first type error, before it has read the rest: `12 garbage`
        # fails as "expected an object, got int" although it is not JSON at all. Only a document that
        # decodes without a schema is a schema violation.
        malformed = _malformation(value, fmt)
        if malformed is not None:
            raise MessageDecodeError(
                ErrorCode.INVALID_MESSAGE, f"cannot decode {fmt} value: {malformed}"
            ) from None
        raise MessageDecodeError(
            ErrorCode.INVALID_REQUEST, f"invalid job: {exc}", _salvage_id(value, fmt), fmt
        ) from None
    except Exception as exc:  # DecodeError, UnicodeDecodeError, RecursionError: the bytes are the problem
        raise MessageDecodeError(
            ErrorCode.INVALID_MESSAGE, f"cannot decode {fmt} value: {_describe(exc)}"
        ) from None
    problem = shape_problem(job)
    if problem is not None:  # the schema's `oneOf`, which a struct cannot say
        raise MessageDecodeError(ErrorCode.INVALID_REQUEST, f"invalid job: {problem}", job.id, fmt)
    return job, fmt


class Undecodable(msgspec.Struct, frozen=True):
    """A record value that is no job, as `read_job` answers it: SPEC §3's code, the message, the
    document's own `id` where it could still be read, and the format the error reply takes."""

    code: ErrorCode
    message: str
    job_id: str | None
    fmt: WireFormat


def declared_format(content_type: str | None) -> WireFormat:
    """The reply's format where the bytes cannot tell: the one the content-type header names, else JSON
    (no header, or one that names neither format: `text/plain` is answered in JSON, the default)."""
    return named_format(content_type) or "json"


def read_job(value: bytes | None, content_type: str | None = None) -> tuple[Job, WireFormat] | Undecodable:
    """The decoder of the record's edge (worker/envelope.py's codec): a job and its format, or an
    `Undecodable` that already says what to answer and in which format, so the edge makes one call here
    and never asks again. Bytes that are not a document at all are answered in the declared format;
    a document that breaks the schema in the format it parsed as (`MessageDecodeError.fmt`)."""
    try:
        return decode_job(value, content_type)
    except MessageDecodeError as exc:
        fmt = exc.fmt if exc.fmt is not None else declared_format(content_type)
        return Undecodable(exc.code, str(exc), exc.job_id, fmt)


def shape_problem(job: Job) -> str | None:
    """Why a job sends neither or both of `items` and `documents` (SPEC §10), or None when it sends one."""
    has_items, has_documents = job.items is not msgspec.UNSET, job.documents is not msgspec.UNSET
    if has_items and has_documents:
        return "items and documents: send one of them (documents is the rerank shape of items)"
    if not (has_items or has_documents):
        return "Object missing required field `items` (or `documents`, the rerank shape)"
    return None


def _malformation(value: bytes, fmt: WireFormat) -> str | None:
    """Why `value` is not a well-formed document of its format, or None when it is one.

    Runs only for records that already failed the schema, so the cost of an untyped decode is paid by
    bad jobs alone. The decode must read to the end to prove anything, so nothing may stop it early:
    JSON floats are kept as text (`1e400` is valid JSON, only out of a float's range). What still
    fails is undecodable here, a MessagePack timestamp of an invalid length among them.
    """
    try:
        (_JSON_UNTYPED_DECODER if fmt == "json" else _MSGPACK_UNTYPED_DECODER).decode(value)
    except Exception as exc:  # hostile bytes raise more than DecodeError: all of it means "undecodable"
        return _describe(exc)
    return None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply to decode"
    if isinstance(exc, UnicodeDecodeError):
        return f"invalid UTF-8 in a string at byte {exc.start} of that string"
    if isinstance(exc, msgspec.DecodeError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def _salvage_id(value: bytes, fmt: WireFormat) -> str | None:
    """Best effort, for correlation only: any failure to read the id just means there is none."""
    try:
        return (_JSON_ID_DECODER if fmt == "json" else _MSGPACK_ID_DECODER).decode(value).id
    except Exception:  # best effort, by design: no id is a fine answer
        return None


def encode_job(job: Job, fmt: WireFormat = "json") -> bytes:
    return (_JSON_ENCODER if fmt == "json" else _MSGPACK_ENCODER).encode(job)


def encode_result(result: Result, fmt: WireFormat = "json") -> bytes:
    return (_JSON_ENCODER if fmt == "json" else _MSGPACK_ENCODER).encode(result)


_JSON_RESULT_DECODER = msgspec.json.Decoder(Result)
_MSGPACK_RESULT_DECODER = msgspec.msgpack.Decoder(Result)


def decode_result(value: bytes, content_type: str | None = None) -> Result:
    fmt = sniff_format(value, content_type)
    return (_JSON_RESULT_DECODER if fmt == "json" else _MSGPACK_RESULT_DECODER).decode(value)


def content_type_of(fmt: WireFormat) -> str:
    return CONTENT_TYPE_JSON if fmt == "json" else CONTENT_TYPE_MSGPACK


def parse_chunking(text: str) -> Chunking | None:
    """The `chunking` setting (the job field's JSON object as text) decoded by the job's own decoder,
    so it accepts exactly what a job may send; "" is None (no default chunking)."""
    if not text.strip():
        return None
    try:
        return msgspec.json.decode(text, type=Chunking)
    except msgspec.DecodeError as exc:
        raise ValueError(
            f'not a chunking object ({exc}); e.g. {{"window": null, "overlap": 0, "aggregate": "max"}}'
        ) from None
