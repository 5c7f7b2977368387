"""Fuzzed intake: whatever a record holds, the real edge and the real engine give a job or a typed error.

Drives the record codec (envelope.py) and then `Scorer.prepare` on a tiny real model with generated JSON,
MessagePack and raw bytes, and random headers, and checks the only outcomes SPEC §3 allows: a job
(prepared for the device, or answered without a forward), `invalid_message` with an untouched
dead-letter copy for bytes that do not decode, `invalid_request` (or a size code) without one for a
document that decodes but breaks the schema. No exception may escape: in the worker one would be a
record that stops the consumer group.

The default run is short; `pytest --hypothesis-profile=long tests/worker/test_intake_fuzz.py` runs
each property thousands of times (profiles are registered in tests/conftest.py).
"""

from __future__ import annotations

import itertools
import json

import msgspec
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kafka_scorer.engine.prepare.prepared import PreparedJob
from kafka_scorer.engine.scorer import Scorer
from kafka_scorer.wire.protocol import ErrorCode, Result, decode_result
from kafka_scorer.worker.envelope import Inbound, RecordCodec, Rejected
from tests.worker.conftest import Rec

MAX_PAIR_TOKENS = 64
MAX_HEADER_BYTES = 4096
CODEC = RecordCodec(
    reply_topic="results",
    dead_letter_topic_for=lambda t: f"{t}.DLT",
    max_message_bytes=1 << 20,
    model_name="fuzz-model",
    group_id="g",
    max_header_bytes=MAX_HEADER_BYTES,
)
JSON_CT = ("content-type", b"application/json")
MSGPACK_CT = ("content-type", b"application/msgpack")
# Codes a decoded job may get from the engine; `internal` would mean the engine broke on input.
ENGINE_CODES = {
    ErrorCode.INVALID_REQUEST,
    ErrorCode.TOO_LONG,
    ErrorCode.UNSUPPORTED,
    ErrorCode.MODEL_MISMATCH,
}


def _examples(short: int) -> int:
    """`short` by default; the `long` profile's count (thousands) when it is the loaded profile."""
    configured = settings.default.max_examples
    return configured if configured > 1000 else short


def _fuzz(short: int):
    return settings(
        max_examples=_examples(short),
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


@pytest.fixture(scope="session")
def fuzz_scorer(tiny_models) -> Scorer:
    path = tiny_models.get("qwen3", "causal")
    return Scorer(
        str(path),
        served_model_name="fuzz-model",
        dtype="float32",
        device="cpu",
        max_pair_tokens=MAX_PAIR_TOKENS,
        max_labels_per_job=64,
    )


# ---- generators ----------------------------------------------------------------------------------


def _scalars(fmt: str) -> st.SearchStrategy:
    common = [
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**64 - 1),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=20),
        st.binary(max_size=10),
    ]
    if fmt == "json":
        return st.one_of(*common, st.integers(2**64, 2**300), st.integers(-(2**300), -(2**63) - 1))
    # Application ext types (0..127); the reserved -1 is the timestamp, whose payload must be valid
    # to decode at all (test_envelope covers an invalid one).
    ext = st.builds(msgspec.msgpack.Ext, st.integers(0, 127), st.binary(max_size=12))
    return st.one_of(*common, ext)


def _values(fmt: str) -> st.SearchStrategy:
    return st.recursive(
        _scalars(fmt),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=16,
    )


_TEXT = st.text(max_size=40) | st.integers(0, 20_000).map(lambda n: "word " * n)  # empty to giant
_IDS = st.lists(st.integers(-5, 600), max_size=90)


_CHUNKING = st.fixed_dictionaries(
    {},
    optional={
        "window": st.one_of(st.none(), st.integers(-1, 80)),
        "overlap": st.integers(-1, 40),
        "aggregate": st.sampled_from(["max", "mean", "first", "median"]),
    },
)
"""SPEC §9 chunking objects, mostly valid; the window and overlap around the fuzz pair limit."""


_FIELD_NAME = st.sampled_from(["text", "title", "body", ""])
_DOCUMENT = st.one_of(
    _TEXT,
    st.dictionaries(
        _FIELD_NAME,
        st.one_of(_TEXT, st.integers(-(2**63), 2**63 - 1), st.none(), st.lists(_TEXT, max_size=2)),
    ),
)
"""SPEC §10 documents: texts, and objects whose fields are sometimes text, sometimes not, sometimes
missing; the field names are few so that a job's `rank_fields` often names one."""
_TEXT_OBJECT = st.fixed_dictionaries(
    {"text": st.text(max_size=30)}, optional={"title": st.text(max_size=9), "n": st.integers(0, 9)}
)


def _job_documents(fmt: str) -> st.SearchStrategy:
    """Job-shaped maps with every field sometimes right, sometimes of any type; unknown fields too."""
    anything = _values(fmt)
    fields = {
        "query": st.one_of(_TEXT, _IDS, anything),
        "items": st.one_of(st.lists(_TEXT, max_size=5), st.lists(_IDS, max_size=5), anything),
        "id": st.one_of(st.text(max_size=30), anything),
        "label_token_ids": st.one_of(st.lists(st.integers(-3, 600), min_size=1, max_size=80), anything),
        "apply_softmax": st.one_of(st.booleans(), anything),
        "item_first": st.one_of(st.booleans(), anything),
        "return_pooled_hidden_states": st.one_of(st.booleans(), anything),
        "multi_item": st.one_of(st.none(), st.booleans(), anything),
        "model": st.one_of(st.just("fuzz-model"), st.text(max_size=10), anything),
        "truncate": st.one_of(st.none(), st.booleans(), anything),
        "label_tokens": st.one_of(
            st.lists(st.sampled_from(["yes", "no", "", "yes no"]) | st.text(max_size=6)), anything
        ),
        "instruction": st.one_of(st.none(), _TEXT, anything),
        "top_n": st.one_of(st.none(), st.integers(-3, 12), anything),
        "rank_by": st.one_of(st.none(), st.integers(-3, 4), anything),
        "activation": st.one_of(st.sampled_from(["none", "softmax", "sigmoid", "relu"]), anything),
        "chunking": st.one_of(st.none(), _CHUNKING, anything),
        "timeout_ms": st.one_of(st.none(), st.integers(-2, 2**40), anything),
        "priority": st.one_of(st.none(), st.integers(-130, 130), anything),
        "documents": st.one_of(st.lists(_DOCUMENT, max_size=5), anything),
        "rank_fields": st.one_of(st.none(), st.lists(_FIELD_NAME, max_size=3), anything),
        "return_documents": st.one_of(st.booleans(), anything),
    }
    known = st.fixed_dictionaries({}, optional=fields)
    unknown = st.dictionaries(st.text(max_size=10), anything, max_size=2)
    documents = st.builds(lambda k, u, mix: {**u, **k} if mix else k, known, unknown, st.booleans())
    return st.one_of(documents, documents, anything)  # mostly job-like, sometimes anything at all


def _encode(document: object, fmt: str) -> bytes:
    return msgspec.json.encode(document) if fmt == "json" else msgspec.msgpack.encode(document)


_NOISE_HEADERS = st.lists(
    st.tuples(
        st.sampled_from(["trace", "x-Id", "b3", "traceparent", ""]),
        st.none() | st.binary(max_size=40) | st.integers(0, 6000).map(lambda n: b"\xfe" * n),
    ),
    max_size=4,
)
_INVALID_UTF8 = st.sampled_from(
    [b"\xff", b"\xfe", b"\x80", b"\xc0\xaf", b"\xc1\xbf", b"\xed\xa0\x80", b"\xf8\x88\x80\x80", b"\xe2\x82"]
)
_MARKER = "@@BAD@@"
HEADER_NAMES = ["correlation_id", "kafka_correlationId", "CORRELATION_ID", "reply_topic", "kafka_replyTopic"]
HEADER_NAMES += ["content-type", "contentType", "x"]


# ---- the oracle ----------------------------------------------------------------------------------


def _headers_size(headers: list[tuple[str, bytes | None]]) -> int:
    return sum(len(name.encode()) + len(value or b"") for name, value in headers)


def _run(scorer: Scorer, record: Rec) -> tuple[Inbound | Rejected, PreparedJob | Result | None]:
    """The worker's path for one record; asserts the invariants every outcome must keep."""
    decoded = CODEC.decode_record(record)
    reply = CODEC.encode_record(
        decoded.result if isinstance(decoded, Rejected) else Result(id=decoded.job_id, scores=[]),
        decoded.origin,
    )
    assert decode_result(
        reply.value, "application/json" if decoded.origin.fmt == "json" else "application/msgpack"
    )
    assert _headers_size(reply.headers) <= MAX_HEADER_BYTES + 64, "a reply must never echo oversized headers"
    if isinstance(decoded, Rejected):
        error = decoded.result.error
        assert error is not None and decoded.result.scores is None
        if error.code is ErrorCode.INVALID_MESSAGE:
            assert decoded.dead_letter is not None or (record.value is None and record.key is None)
            if decoded.dead_letter is not None:
                assert decoded.dead_letter.value == record.value and decoded.dead_letter.key == record.key
                assert decoded.dead_letter.topic == "jobs.DLT"
        else:
            assert error.code in (ErrorCode.INVALID_REQUEST, ErrorCode.TOO_LONG), error
            assert decoded.dead_letter is None
        return decoded, None
    prepared = scorer.engine.prepare(decoded.job, decoded.job_id)
    if isinstance(prepared, Result):
        if prepared.error is not None:
            assert prepared.error.code in ENGINE_CODES, prepared.error
        else:
            assert prepared.scores == [] and not decoded.job.inputs
    else:
        assert isinstance(prepared, PreparedJob)
        pairs = [len(prepared.query) + len(item) for item in prepared.items]
        assert pairs and max(pairs) <= MAX_PAIR_TOKENS and min(pairs) > 0
    return decoded, prepared


def _code(decoded: Inbound | Rejected) -> ErrorCode | None:
    return decoded.result.error.code if isinstance(decoded, Rejected) and decoded.result.error else None


# ---- properties ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def templated_fuzz_scorer(tmp_path_factory) -> Scorer:
    """The same limits behind the qwen3-reranker template: every text job goes through the template's
    pieces, the seam repair and the label lookup by text."""
    from kafka_scorer.checkpoints.tiny_models import build_tiny_reranker

    return Scorer(
        str(build_tiny_reranker(tmp_path_factory.mktemp("fuzz-reranker"))),
        served_model_name="fuzz-model",
        dtype="float32",
        device="cpu",
        max_pair_tokens=MAX_PAIR_TOKENS,
        max_labels_per_job=64,
        template="qwen3-reranker",
    )


@_fuzz(120)
@pytest.mark.parametrize("served", ["fuzz_scorer", "templated_fuzz_scorer"])
@given(data=st.data(), fmt=st.sampled_from(["json", "msgpack"]), declared=st.booleans())
def test_well_formed_documents_are_jobs_or_schema_errors(request, served, data, fmt, declared):
    """A document that decodes is never dead-lettered: it is a job, or `invalid_request` / `too_long`."""
    scorer = request.getfixturevalue(served)
    document = data.draw(_job_documents(fmt), label="document")
    value = _encode(document, fmt)
    noise = data.draw(_NOISE_HEADERS, label="noise headers")
    headers = [*noise, (JSON_CT if fmt == "json" else MSGPACK_CT)] if declared else noise
    decoded, _ = _run(scorer, Rec(value, headers))
    code = _code(decoded)
    if _headers_size(headers) > MAX_HEADER_BYTES:
        assert code is ErrorCode.INVALID_REQUEST and "max_header_bytes" in decoded.result.error.message
        return
    sniffable = isinstance(document, dict) or (fmt == "json" and isinstance(document, list))
    if not declared and not sniffable:  # a bare scalar without a content-type is not a job document
        assert code is ErrorCode.INVALID_MESSAGE
    else:
        assert code is not ErrorCode.INVALID_MESSAGE, (value[:200], decoded.result.error)


@_fuzz(80)
@given(data=st.data(), fmt=st.sampled_from(["json", "msgpack"]), declared=st.booleans())
def test_invalid_utf8_inside_any_string_is_invalid_message(fuzz_scorer, data, fmt, declared):
    """Wherever the bad string sits (a field, an unknown field, before or after a schema error)."""
    document = data.draw(_job_documents(fmt).filter(lambda d: isinstance(d, dict)), label="document")
    where = data.draw(st.sampled_from(["query", "id", "model", "zz-unknown"]), label="field")
    document = {**document, where: _MARKER}
    bad = data.draw(_INVALID_UTF8, label="bytes")
    value = _encode(document, fmt).replace(_MARKER.encode(), (bad + b"aaaaaaa")[: len(_MARKER)], 1)
    decoded, _ = _run(fuzz_scorer, Rec(value, [JSON_CT if fmt == "json" else MSGPACK_CT] if declared else []))
    assert _code(decoded) is ErrorCode.INVALID_MESSAGE, (value[:200], decoded)


@_fuzz(120)
@given(
    value=st.none() | st.binary(max_size=200) | st.binary(max_size=30).map(lambda b: b"{" + b),
    key=st.none() | st.binary(max_size=8),
    content_type=st.sampled_from([None, b"application/json", b"application/msgpack", b"text/plain", b"\xff"]),
)
def test_raw_bytes_never_escape_as_exceptions(fuzz_scorer, value, key, content_type):
    """Arbitrary bytes under any label; a schema error is claimed only for a document that parses."""
    headers = [] if content_type is None else [("content-type", content_type)]
    decoded, _ = _run(fuzz_scorer, Rec(value, headers, key=key))
    if _code(decoded) is ErrorCode.INVALID_REQUEST:
        assert value is not None
        try:
            json.loads(value.decode("utf-8"))
        except (ValueError, RecursionError):
            msgspec.msgpack.decode(value)  # then it must at least be well-formed MessagePack


@_fuzz(100)
@given(
    headers=st.lists(
        st.tuples(
            st.sampled_from(HEADER_NAMES),
            st.none() | st.binary(max_size=30) | st.text(max_size=30).map(str.encode),
        ),
        max_size=6,
    ),
    huge=st.none() | st.integers(MAX_HEADER_BYTES, 3 * MAX_HEADER_BYTES),
)
def test_random_headers_are_read_by_the_contract(fuzz_scorer, headers, huge):
    """First header wins; binary ids become hex; over the cap nothing is read or echoed."""
    if huge is not None:
        headers = [*headers, ("correlation_id", b"c" * huge)]
    value = msgspec.json.encode({"query": [5, 6], "items": [[7]], "label_token_ids": [1]})
    decoded, prepared = _run(fuzz_scorer, Rec(value, headers))
    if _headers_size(headers) > MAX_HEADER_BYTES:
        assert _code(decoded) is ErrorCode.INVALID_REQUEST and decoded.origin.correlation is None
        assert decoded.result.id == "jobs:2:41" and decoded.origin.reply_topic == "results"
        return
    correlation = next((h for h in headers if h[0] in ("correlation_id", "kafka_correlationId")), None)
    correlation = correlation or next((h for h in headers if h[0].lower() == "correlation_id"), None)
    assert decoded.origin.correlation == correlation
    if isinstance(decoded, Inbound):
        assert isinstance(prepared, PreparedJob)
        if correlation is not None and correlation[1]:
            try:
                expected = correlation[1].decode("utf-8")
            except UnicodeDecodeError:
                expected = correlation[1].hex()
            assert decoded.job_id == expected
        else:
            assert decoded.job_id == "jobs:2:41"


def test_a_giant_text_is_too_long_and_cheap(fuzz_scorer):
    """Near the record size limit, a single text is rejected by its length, not tokenized."""
    text = "lorem ipsum " * 80_000  # ~960 KB, under max_message_bytes
    value = msgspec.json.encode({"id": "giant", "query": "q", "items": ["a", text], "label_token_ids": [1]})
    _, prepared = _run(fuzz_scorer, Rec(value))
    assert isinstance(prepared, Result) and prepared.error is not None
    assert prepared.error.code is ErrorCode.TOO_LONG and prepared.error.item == 1


@_fuzz(60)
@pytest.mark.parametrize("served", ["fuzz_scorer", "templated_fuzz_scorer"])
@given(
    data=st.data(),
    chunking=_CHUNKING,
    lengths=st.lists(st.integers(0, 5 * MAX_PAIR_TOKENS), min_size=1, max_size=4),
    text=st.booleans(),
    multi_item=st.sampled_from([None, True, False]),
    top_n=st.sampled_from([None, 0, 2]),
)
def test_chunked_jobs_are_scored_or_answered_with_a_typed_error(
    request, served, data, chunking, lengths, text, multi_item, top_n
):
    """Generated `chunking` objects and item lengths around the pair limit, through the decoder and a
    forward: a row per item and a consistent `chunks`, or a typed error; never an exception."""
    scorer = request.getfixturevalue(served)
    words = ["río ", "東京 ", "word ", "ab", " ", "😀"]
    if text:
        items = [
            "".join(data.draw(st.lists(st.sampled_from(words), min_size=n, max_size=n))) for n in lengths
        ]
        query = "which river?"
    else:
        items = [[7 + (i * 13) % 300 for i in range(n)] for n in lengths]
        query = [5, 6, 7]
    document = {"query": query, "items": items, "label_token_ids": [3, 4], "chunking": chunking}
    document |= {"multi_item": multi_item, "top_n": top_n}
    decoded, prepared = _run(scorer, Rec(msgspec.json.encode(document), [JSON_CT]))
    if isinstance(decoded, Rejected):
        assert _code(decoded) is ErrorCode.INVALID_REQUEST  # a chunking object outside the schema
        return
    if not isinstance(prepared, PreparedJob):
        return  # a typed error, checked by _run
    (result,) = scorer.engine.run_batch([prepared])
    if result.error is not None:
        assert result.error.code in ENGINE_CODES, result.error
        return
    assert len(result.scores) == len(items)
    for chunk in result.chunks:
        assert 0 <= chunk.index < len(items) and chunk.windows > 1
        assert chunk.unit == ("characters" if text else "tokens")
        if chunk.window is not None:
            assert 0 <= chunk.window < chunk.windows
        if chunk.span is not None:
            assert 0 <= chunk.span[0] < chunk.span[1] <= len(items[chunk.index])
    if top_n is not None:
        assert len(result.ranking) == min(top_n, len(items))


@_fuzz(60)
@pytest.mark.parametrize("served", ["fuzz_scorer", "templated_fuzz_scorer"])
@given(
    data=st.data(),
    documents=st.lists(st.one_of(st.text(max_size=30), _TEXT_OBJECT, _DOCUMENT), max_size=5),
    rank_fields=st.one_of(st.none(), st.lists(_FIELD_NAME, max_size=3)),
    returned=st.booleans(),
    top_n=st.sampled_from([None, 0, 2, 9]),
    fmt=st.sampled_from(["json", "msgpack"]),
)
def test_rerank_shaped_jobs_are_answered_with_results_or_a_typed_error(
    request, served, data, documents, rank_fields, returned, top_n, fmt
):
    """Generated `documents` / `rank_fields` / `return_documents` (SPEC §10) through the decoder and a
    forward: `results` by relevance, one entry per document up to `top_n`, each echoing its document
    when asked; or a typed error naming the document. Never an exception."""
    scorer = request.getfixturevalue(served)
    query = data.draw(st.sampled_from(["which river?", "which river?", "", [5, 6, 7]]), label="query")
    document = {"query": query, "documents": documents, "label_token_ids": [3, 4], "top_n": top_n}
    document |= {"rank_fields": rank_fields, "return_documents": returned}
    decoded, prepared = _run(scorer, Rec(_encode(document, fmt), [JSON_CT if fmt == "json" else MSGPACK_CT]))
    assert isinstance(decoded, Inbound), decoded.result.error  # a well-typed job always decodes
    if isinstance(prepared, Result):  # a typed error (checked by _run), or no documents
        event(f"prepare: {prepared.error.code.value if prepared.error else 'no documents'}")
        assert prepared.error is not None or (prepared.results == [] and prepared.ranking is None)
        return
    (result,) = scorer.engine.run_batch([prepared])
    if result.error is not None:
        assert result.error.code in ENGINE_CODES, result.error
        return
    event("results")
    assert result.ranking is None and len(result.scores) == len(documents)
    indices = [entry.index for entry in result.results]
    assert len(indices) == min(len(documents), len(documents) if top_n is None else top_n)
    assert len(set(indices)) == len(indices) and all(0 <= i < len(documents) for i in indices)
    scores = [entry.relevance_score for entry in result.results]
    assert all(a >= b for a, b in itertools.pairwise(scores) if a == a and b == b)  # NaN ranks last
    for entry in result.results:
        sent = documents[entry.index]
        want = ({"text": sent} if isinstance(sent, str) else sent) if returned else None
        assert entry.document == want
    decode_result(CODEC.encode_record(result, decoded.origin).value, f"application/{fmt}")  # it encodes back
