"""The rerank request shape (SPEC §10): `documents`, `rank_fields`, `return_documents`, `top_n`, and
`results: [{index, relevance_score, document?}]`.

A `documents` job must score exactly as the same job sent as `items` (the documents' texts), and each
`relevance_score` must equal an independent reference for its model kind: a CausalLM reranker's
P(yes) / (P(yes) + P(no)) from a plain transformers forward of the model card's prompt, a decoder
classifier's head output from plain transformers, a cross-encoder's score from sentence-transformers'
`CrossEncoder.predict` (its default sigmoid for one logit), a late-interaction (ColBERT) model's MaxSim
from sentence-transformers' `MultiVectorEncoder`. The order and the echo are checked against rules
written out here; every hostile use of the new fields is a typed error. What the shape promises beyond
a kind's relevance (the text field, the echo, `documents: []`, the typed errors, equal documents) is a
contract over kinds: those tests run on the CausalLM reranker and on the ColBERT kind alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest

from kafka_scorer.engine.scorer import Scorer
from kafka_scorer.wire.protocol import Chunking, ErrorCode, Job, Result
from tests.engine.reference import reference_scores
from tests.engine.test_encoders import one_thread

QUERY = "Which river is the longest?"
DOCS = [
    "The Nile is the longest river in Africa.",
    {"title": "Amazon", "text": "The Amazon carries the most water.", "id": 7},
    "",
    {"title": "Danube", "text": "The Danube crosses ten countries.", "tags": ["europe", 2]},
    "Kafka is a log.",
]
FIELDS = ["title", "text"]
TEXTS = [
    DOCS[0],
    "Amazon\nThe Amazon carries the most water.",
    "",
    "Danube\nThe Danube crosses ten countries.",
    DOCS[4],
]
"""The documents' scored texts by the rule of docs/message-schema.md: rank fields joined by newlines."""
TOLERANCE = 1e-5


def rule_order(scores: list[float]) -> list[int]:
    """Highest first, ties by lower index, NaN last (docs/message-schema.md)."""
    return sorted(range(len(scores)), key=lambda i: (math.isnan(scores[i]), -scores[i], i))


def one(scorer: Scorer, **fields) -> Result:
    (result,) = scorer.score_jobs([Job(query=fields.pop("query", QUERY), **fields)])
    return result


def check_results(
    result: Result, relevance: list[float], top_n: int | None, returned: bool, tolerance: float = TOLERANCE
) -> None:
    assert result.ok, result.error
    assert result.ranking is None  # the rerank shape answers with `results` instead
    want = rule_order(relevance)[:top_n]
    assert [entry.index for entry in result.results] == want
    for entry in result.results:
        assert entry.relevance_score == pytest.approx(relevance[entry.index], abs=tolerance)
        if returned:
            sent = DOCS[entry.index]
            assert entry.document == ({"text": sent} if isinstance(sent, str) else sent)
        else:
            assert entry.document is None


@dataclass
class Kind:
    """A served kind: its scorer, and how to open its checkpoint again with other settings."""

    scorer: Scorer
    path: Path
    options: dict

    def opened(self, **options) -> Scorer:
        from kafka_scorer.engine.scorer import Scorer

        return Scorer(str(self.path), dtype="float32", device="cpu", **self.options, **options)


@pytest.fixture(scope="module")
def reranker_kind(tmp_path_factory) -> Kind:
    from kafka_scorer.checkpoints.tiny_models import build_tiny_reranker

    path = build_tiny_reranker(tmp_path_factory.mktemp("rerank-shape"))
    options = {"template": "qwen3-reranker", "prefix_cache_mb": 0}
    return Kind(Scorer(str(path), dtype="float32", device="cpu", **options), path, options)


@pytest.fixture(scope="module")
def colbert_kind(tmp_path_factory) -> Kind:
    from kafka_scorer.checkpoints.tiny_colbert import build_tiny_colbert

    path = build_tiny_colbert(tmp_path_factory.mktemp("rerank-shape-colbert"))
    kind = Kind(None, path, {"embedding_cache_mb": 0})  # type: ignore[arg-type]
    kind.scorer = kind.opened()
    return kind


@pytest.fixture(scope="module")
def reranker(reranker_kind):
    return reranker_kind.scorer, reranker_kind.path


@pytest.fixture(scope="module")
def colbert(colbert_kind):
    return colbert_kind.scorer, colbert_kind.path


@pytest.fixture(params=["reranker_kind", "colbert_kind"], ids=["causal-reranker", "colbert"])
def kind(request) -> Kind:
    """The rerank shape's contract holds for every kind: each test taking this runs on both."""
    return request.getfixturevalue(request.param)


@pytest.fixture
def any_kind(kind) -> Scorer:
    return kind.scorer


@pytest.mark.parametrize("apply_softmax", [False, True])
@pytest.mark.parametrize(("top_n", "returned"), [(None, False), (2, True), (0, True), (9, False)])
def test_causal_reranker_relevance_is_the_normalised_yes_probability(
    reranker, apply_softmax, top_n, returned
):
    from tests.engine.test_templates import card_prompt, reference_rows

    scorer, path = reranker
    fields = dict(rank_fields=FIELDS, apply_softmax=apply_softmax, top_n=top_n)
    got = one(scorer, documents=DOCS, return_documents=returned, **fields)
    same = one(scorer, items=TEXTS, apply_softmax=apply_softmax, top_n=top_n)
    assert got.scores == same.scores and got.prompt_tokens == same.prompt_tokens
    probabilities = reference_rows(path, [card_prompt(QUERY, text) for text in TEXTS], ["yes", "no"], False)
    relevance = [yes / (yes + no) for yes, no in probabilities]
    check_results(got, relevance, top_n, returned)


def test_decoder_classifier_relevance_is_its_rank_by_class(scorer_for, tiny_models):
    scorer = scorer_for("qwen3", "classification", 3)
    path = tiny_models.get("qwen3", "classification", 3)
    for rank_by in (None, 0):
        got = one(scorer, documents=DOCS, rank_fields=FIELDS, rank_by=rank_by, return_documents=True)
        assert got.scores == one(scorer, items=TEXTS, rank_by=rank_by).scores
        column = 2 if rank_by is None else rank_by  # the last class by default
        relevance = [row[column] for row in reference_scores(path, QUERY, TEXTS)]
        check_results(got, relevance, None, True)


def test_cross_encoder_relevance_is_cross_encoder_predict(minilm_cross_encoder):
    from sentence_transformers import CrossEncoder

    path = minilm_cross_encoder(1)
    scorer = Scorer(str(path), dtype="float32", device="cpu")
    got = one(scorer, documents=DOCS, rank_fields=FIELDS, activation="sigmoid", top_n=3)
    assert got.scores == one(scorer, items=TEXTS, activation="sigmoid").scores
    with one_thread():
        predicted = CrossEncoder(str(path), device="cpu").predict([(QUERY, t) for t in TEXTS], batch_size=1)
    check_results(got, [float(score) for score in predicted], 3, False)


@pytest.mark.parametrize(("top_n", "returned"), [(None, False), (2, True), (0, True), (9, False)])
def test_colbert_relevance_is_the_multi_vector_encoders_maxsim(colbert, top_n, returned):
    """A ColBERT document's `relevance_score` is its MaxSim score: the reference encodes with
    sentence-transformers' `MultiVectorEncoder` and takes MaxSim one (query, document) pair at a time."""
    from sentence_transformers import MultiVectorEncoder

    from tests.engine.late_interaction.test_late_scores import TOLERANCE as LATE_TOLERANCE
    from tests.engine.late_interaction.test_late_scores import reference_scores as maxsim_reference

    scorer, path = colbert
    got = one(scorer, documents=DOCS, rank_fields=FIELDS, top_n=top_n, return_documents=returned)
    assert got.scores == one(scorer, items=TEXTS).scores
    relevance = maxsim_reference(MultiVectorEncoder(str(path), device="cpu"), QUERY, TEXTS)
    assert [row[0] for row in got.scores] == pytest.approx(relevance, abs=LATE_TOLERANCE)
    check_results(got, relevance, top_n, returned, tolerance=LATE_TOLERANCE)


def test_text_documents_default_to_the_text_field(any_kind):
    objects = [{"text": text} for text in TEXTS]
    by_field = one(any_kind, documents=objects)
    assert by_field.ok and by_field.scores == one(any_kind, items=TEXTS).scores


def test_documents_chunk_like_items(any_kind):
    _assert_documents_chunk_like_items(any_kind, Chunking(window=12, overlap=4, aggregate="mean"))


def _assert_documents_chunk_like_items(scorer, chunking: Chunking) -> None:
    """A long document and a short one: the same windows and scores as items, the texts returned."""
    long = ["río " * 120, "short"]
    chunked = one(scorer, documents=long, chunking=chunking, return_documents=True)
    plain = one(scorer, items=long, chunking=chunking)
    assert chunked.ok and chunked.scores == plain.scores and chunked.chunks == plain.chunks
    assert [c.index for c in chunked.chunks] == [0]
    assert {entry.index: entry.document for entry in chunked.results} == {
        0: {"text": long[0]},
        1: {"text": "short"},
    }


def test_long_documents_chunk_like_items_at_the_pair_limit(reranker):
    # the long document needs windows at the model's pair limit below
    small = Scorer(
        str(reranker[1]), dtype="float32", device="cpu", template="qwen3-reranker", max_pair_tokens=160
    )
    # `max` picks by relevance: the test below
    _assert_documents_chunk_like_items(small, Chunking(overlap=4, aggregate="mean"))


def test_empty_documents_give_empty_results(any_kind):
    result = one(any_kind, documents=[], top_n=3, return_documents=True)
    assert result.ok and result.scores == [] and result.results == [] and result.ranking is None


def test_equal_documents_score_alike_and_rank_by_index(kind):
    """Three copies of one text (as a text and as objects, among other documents) get bit-equal
    scores, so they rank by index; a job cut into several forwards by a small token budget too."""
    same = "The Nile is the longest river in Africa."
    documents = ["Kafka is a log.", same, {"text": same}, "A river.", {"text": same, "id": 3}, "Rain."]
    for scorer in (kind.scorer, kind.opened(max_batch_tokens=64)):
        result = one(scorer, documents=documents * 3)
        assert result.ok
        copies = [row[0] for index, row in enumerate(result.scores) if index % 6 in (1, 2, 4)]
        assert len(set(copies)) == 1, copies
        ranked = [entry.index for entry in result.results if entry.index % 6 in (1, 2, 4)]
        assert ranked == sorted(ranked)


def test_results_cross_the_wire_in_both_formats(any_kind):
    from kafka_scorer.wire.protocol import decode_job, decode_result, encode_result

    scorer = any_kind
    document = {"query": QUERY, "documents": DOCS, "rank_fields": FIELDS, "return_documents": True}
    for fmt, encode in (("json", msgspec.json.encode), ("msgpack", msgspec.msgpack.encode)):
        job, _ = decode_job(encode(document), f"application/{fmt}")
        (result,) = scorer.score_jobs([job])
        back = decode_result(encode_result(result, fmt), f"application/{fmt}")
        assert back.results == result.results and back.results[0].document is not None


HOSTILE = [
    ({"items": ["a"], "documents": ["b"]}, "items and documents"),
    ({}, "items"),
    ({"documents": ["a"], "query": [5, 6]}, "token ids"),
    ({"items": [[5], [6]], "query": [5, 6], "return_documents": True}, "return_documents"),
    ({"items": ["a"], "rank_fields": ["text"]}, "rank_fields"),
    ({"documents": [{"title": "x"}]}, "'text'"),
    ({"documents": [{"title": "x"}, {"body": "y"}], "rank_fields": ["title"]}, "document 1"),
    ({"documents": [{"text": 3}]}, "not text"),
    ({"documents": [{"text": ["a"]}]}, "not text"),
    ({"documents": ["a"], "rank_fields": []}, "at least one"),
]


@pytest.mark.parametrize(("fields", "needle"), HOSTILE)
def test_hostile_rerank_fields_are_invalid_requests(any_kind, fields, needle):
    job = Job(**{"query": QUERY, **fields})  # not popped: the parameter's dict serves every kind
    result = any_kind.engine.prepare(job, "hostile")
    assert isinstance(result, Result) and result.error is not None
    assert result.error.code is ErrorCode.INVALID_REQUEST and needle in result.error.message
    if "document 1" in needle:
        assert result.error.item == 1
    # and through scoring: answered, never raised or `internal`
    (scored,) = any_kind.score_jobs([job])
    assert scored.error is not None and scored.error.code is ErrorCode.INVALID_REQUEST


@pytest.mark.parametrize(("fields", "needle"), HOSTILE)
def test_every_kind_answers_a_hostile_job_alike(reranker, colbert, fields, needle):
    """The same code, message and document index whichever kind is served."""
    job = Job(**{"query": QUERY, **fields})  # not popped: the parameter's dict serves every kind
    errors = [scorer.engine.prepare(job, "hostile").error for scorer in (reranker[0], colbert[0])]
    assert errors[0] == errors[1]


def test_too_many_documents_are_too_long(kind):
    result = one(kind.opened(max_items_per_job=2), documents=["a", "b", "c"])
    assert result.error is not None and result.error.code is ErrorCode.TOO_LONG
    assert "3 items" in result.error.message


def test_rank_fields_on_text_documents_are_ignored_with_a_warning(any_kind):
    result = one(any_kind, documents=["a", "b"], rank_fields=["title"])
    assert result.ok and any("rank_fields ignored" in warning for warning in result.warnings)


def test_max_picks_the_window_by_the_relevance_the_result_reports(reranker):
    """A CausalLM document's `relevance_score` is its yes-share, so `max` must pick its window by that
    share too: the window an `apply_softmax` job (whose rows are that share) picks, not the one with
    the highest raw P(yes)."""
    _, path = reranker
    small = Scorer(str(path), dtype="float32", device="cpu", template="qwen3-reranker", max_pair_tokens=160)
    words = ["río ", "the Nile ", "flows ", "Kafka ", "log ", "east ", "sea "]
    docs = ["".join(words[(i * k) % 7] for i in range(90)) for k in range(1, 8)]
    chunking = Chunking(window=12)
    got = one(small, documents=docs, chunking=chunking)
    shares = one(small, items=docs, chunking=chunking, apply_softmax=True)
    raw = one(small, items=docs, chunking=chunking)
    assert [c.window for c in got.chunks] == [c.window for c in shares.chunks]
    # a templated `items` job ranks (and so picks) by the card's share too (issue 26)
    assert [c.window for c in raw.chunks] == [c.window for c in shares.chunks]
    for entry in got.results:
        assert entry.relevance_score == pytest.approx(shares.scores[entry.index][0], abs=TOLERANCE)


def test_a_single_label_is_its_own_relevance(reranker):
    """Normalised over one label every share would be 1: a lone label's probability ranks instead."""
    from tests.engine.test_templates import card_prompt, reference_rows

    scorer, path = reranker
    got = one(scorer, documents=DOCS, rank_fields=FIELDS, label_tokens=["yes"])
    (yes,) = zip(*reference_rows(path, [card_prompt(QUERY, text) for text in TEXTS], ["yes"], False))
    check_results(got, list(yes), None, False)
