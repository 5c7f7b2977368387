"""The published contract (docs/contract/) is what the code generates, and the Job schema accepts
exactly the JSON documents the worker's decoder accepts — checked with an independent validator
(jsonschema) on generated documents, valid and broken alike."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka_scorer.wire.contract import asyncapi, documents, json_schema
from kafka_scorer.wire.protocol import ErrorCode, Job, MessageDecodeError, Result, decode_job, encode_result

CONTRACT = Path(__file__).resolve().parents[1] / "docs" / "contract"

_INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_SCALARS = st.one_of(
    st.none(), st.booleans(), _INT64, st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8)
)
_TOKENS = st.lists(st.integers(min_value=0, max_value=1000), max_size=4)
_FIELD_VALUES = {
    "id": st.one_of(st.text(max_size=8), st.none(), _INT64),
    "query": st.one_of(st.text(max_size=8), _TOKENS, _SCALARS),
    "items": st.one_of(
        st.lists(st.text(max_size=8), max_size=3), st.lists(_TOKENS, max_size=3), _SCALARS, st.lists(_SCALARS)
    ),
    "label_token_ids": st.one_of(_TOKENS, st.none(), st.lists(_SCALARS, max_size=2), _SCALARS),
    "apply_softmax": st.one_of(st.booleans(), _SCALARS),
    "item_first": st.one_of(st.booleans(), _SCALARS),
    "return_pooled_hidden_states": st.booleans(),
    "multi_item": st.one_of(st.booleans(), st.none(), _SCALARS),
    "model": st.one_of(st.text(max_size=8), st.none(), _INT64),
    "timeout_ms": st.one_of(st.none(), st.integers(min_value=-2, max_value=2), _INT64, _SCALARS),
    "priority": st.one_of(st.none(), st.integers(min_value=-130, max_value=130), _SCALARS),
    "chunking": st.one_of(
        st.none(),
        _SCALARS,
        st.fixed_dictionaries(
            {},
            optional={
                "window": st.one_of(st.none(), st.integers(-2, 600), _SCALARS),
                "overlap": st.one_of(st.integers(-2, 64), _SCALARS),
                "aggregate": st.one_of(st.sampled_from(["max", "mean", "first", "sum", "MAX"]), _SCALARS),
                "stride": st.integers(0, 4),
            },
        ),
    ),
    "documents": st.one_of(
        st.lists(st.one_of(st.text(max_size=8), st.dictionaries(st.text(max_size=5), _SCALARS, max_size=3))),
        st.lists(_SCALARS, max_size=2),
        _SCALARS,
    ),
    "rank_fields": st.one_of(st.none(), st.lists(st.text(max_size=5), max_size=3), _SCALARS),
    "return_documents": st.one_of(st.booleans(), _SCALARS),
    "no_such_field": _SCALARS,
}


@st.composite
def job_documents(draw: st.DrawFn) -> object:
    """Mostly objects with a random subset of fields (some mistyped, some unknown), sometimes not an
    object at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.one_of(_SCALARS, st.lists(_SCALARS, max_size=2)))
    names = draw(st.sets(st.sampled_from(sorted(_FIELD_VALUES)), max_size=len(_FIELD_VALUES)))
    if draw(st.booleans()):  # mostly one of items and documents (SPEC §10), sometimes both or neither
        names |= {"query", draw(st.sampled_from(["items", "items", "documents"]))}
    return {name: draw(_FIELD_VALUES[name]) for name in sorted(names)}


# JSON Schema calls 1.0 an integer (a number with no fraction); the decoder, like most typed clients,
# reads only an integer literal into an integer field. The docs say so; the check reads "integer" alike.
_JOB_VALIDATOR = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool)
    ),
)


def _decodes(document: object) -> bool:
    try:
        decode_job(json.dumps(document).encode(), "application/json")
    except MessageDecodeError as exc:
        assert exc.code is ErrorCode.INVALID_REQUEST, exc  # well-formed JSON is never invalid_message
        return False
    return True


def _words(node: object) -> object:
    """A contract document as its meaning: parsed JSON (key order and layout aside), every string
    compared word by word, so a renderer's line breaks or indentation (msgspec 0.23 began to dedent
    docstrings) never fail the test, while any field, type, rule or word that changes does."""
    if isinstance(node, dict):
        return {key: _words(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_words(item) for item in node]
    return " ".join(node.split()) if isinstance(node, str) else node


def _stale(name: str, published: str, generated: str) -> str | None:
    if _words(json.loads(published)) == _words(json.loads(generated)):
        return None
    return f"docs/contract/{name} is stale: run python -m kafka_scorer.wire.contract docs/contract"


def test_published_documents_are_current() -> None:
    """Regenerate with `python -m kafka_scorer.wire.contract docs/contract` after changing a wire struct."""
    for name, text in documents().items():
        path = CONTRACT / name
        assert path.exists(), f"{path} missing: run python -m kafka_scorer.wire.contract docs/contract"
        assert _stale(name, path.read_text(), text) is None


def test_only_a_real_change_makes_a_document_stale() -> None:
    """Re-indented descriptions and reflowed JSON read the same; a new field, a changed type and a
    changed word do not."""
    text = documents()["job.schema.json"]
    doc = json.loads(text)
    job = doc["$defs"]["Job"]
    reflowed = json.dumps(doc, indent=4).replace("\\n\\n", "\\n\\n    ")
    assert _stale("job.schema.json", reflowed, text) is None
    for change in (
        lambda d: d["$defs"]["Job"]["properties"].update(new_field={"type": "string"}),
        lambda d: d["$defs"]["Job"]["properties"]["query"].update(type="integer"),
        lambda d: d["$defs"]["Job"].update(description=job["description"].replace("request", "ask")),
    ):
        changed = json.loads(text)
        change(changed)
        assert _stale("job.schema.json", json.dumps(changed), text), change


def test_descriptions_read_the_same_from_every_msgspec() -> None:
    """The generated files themselves carry no docstring indentation, whichever msgspec wrote them
    (0.19-0.22 kept the source's indentation, 0.23 dedents), so regenerating them does not churn."""
    for name, text in documents().items():
        assert "\\n    " not in text, name


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(job_documents())
def test_job_schema_accepts_exactly_what_the_worker_decodes(document: object) -> None:
    validator = _JOB_VALIDATOR(json_schema(Job, "job"))
    assert validator.is_valid(document) is _decodes(document), document


def test_the_job_schema_asks_for_items_or_documents_not_both() -> None:
    validator = _JOB_VALIDATOR(json_schema(Job, "job"))
    for document, valid in [
        ({"query": "q", "items": ["a"]}, True),
        ({"query": "q", "documents": ["a", {"text": "b"}]}, True),
        ({"query": "q", "items": ["a"], "documents": ["a"]}, False),
        ({"query": "q"}, False),
        ({"query": "q", "items": None}, False),
    ]:
        assert validator.is_valid(document) is valid is _decodes(document), document


def test_a_real_result_validates() -> None:
    from kafka_scorer.wire.protocol import ErrorInfo, Reranked

    ok = Result(id="a", scores=[[0.25, 0.75]], prompt_tokens=9, model="m", warnings=["w"])
    failed = Result(id="b", scores=None, error=ErrorInfo(code=ErrorCode.TOO_LONG, message="long", item=1))
    entries = [Reranked(index=1, relevance_score=0.9, document={"text": "x", "n": 2}), Reranked(0, 0.1)]
    reranked = Result(id="c", scores=[[0.1], [0.9]], results=entries)
    validator = jsonschema.Draft202012Validator(json_schema(Result, "result"))
    for result in (ok, failed, reranked):
        validator.validate(json.loads(encode_result(result, "json")))


def test_asyncapi_document_is_well_formed() -> None:
    doc = asyncapi()
    assert doc["asyncapi"].startswith("3.")
    for operation in doc["operations"].values():
        channel = operation["channel"]["$ref"].removeprefix("#/channels/")
        assert channel in doc["channels"]
        for message in operation["messages"]:
            name = message["$ref"].rsplit("/", 1)[-1]
            assert name in doc["channels"][channel]["messages"]
            assert name in doc["components"]["messages"]
    jsonschema.Draft202012Validator.check_schema(doc["components"]["messages"]["job"]["payload"])
