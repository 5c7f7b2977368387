"""SPEC §8 job fields `label_tokens`, `top_n`/`rank_by`, `activation`, and provenance on results,
each against an independent computation (the tokenizer itself, Python's sort, stock transformers)."""

from __future__ import annotations

import hashlib
import itertools
import math
import shutil

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kafka_scorer.engine.prepare.ranking import rank
from kafka_scorer.engine.scorer import Scorer
from kafka_scorer.wire.protocol import ErrorCode
from tests.engine.reference import reference_scores

QUERY = "Which river is longest?"
ITEMS = ["The Nile.", "Kafka topics.", "The Amazon river.", "", "The Nile."]


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    from kafka_scorer.checkpoints.tiny_models import build_tiny_reranker

    return build_tiny_reranker(tmp_path_factory.mktemp("reranker"))


@pytest.fixture(scope="module")
def plain(reranker):
    return Scorer(str(reranker), dtype="float32", device="cpu")


def test_label_tokens_score_as_the_ids_the_tokenizer_gives(plain):
    tokenizer = plain.describe().loaded.tokenizer
    ids = [tokenizer.convert_tokens_to_ids(t) for t in ("yes", "no", "<|im_end|>")]
    by_text = plain.score(QUERY, ITEMS, label_tokens=["yes", "no", "<|im_end|>"])
    by_id = plain.score(QUERY, ITEMS, label_token_ids=ids)
    assert by_text.error is None and by_text.scores == by_id.scores


def test_a_label_text_of_several_tokens_is_refused_by_name(plain):
    result = plain.score(QUERY, ITEMS, label_tokens=["yes", "Sacramento"])
    assert result.error.code is ErrorCode.INVALID_REQUEST
    assert "'Sacramento'" in result.error.message


@pytest.mark.parametrize(
    "fields, needle",
    [
        ({"label_tokens": ["yes"], "label_token_ids": [1]}, "not both"),
        ({"label_tokens": []}, "non-empty"),
        ({"label_tokens": [""]}, "empty string"),
        ({}, "label_token_ids (or label_tokens)"),
    ],
)
def test_label_field_mistakes_are_invalid_requests(plain, fields, needle):
    result = plain.score(QUERY, ITEMS, **fields)
    assert result.error.code is ErrorCode.INVALID_REQUEST and needle in result.error.message


def test_label_tokens_to_a_classifier_are_ignored_with_a_warning(scorer_for):
    result = scorer_for("qwen3", "classification").score("q", ["a"], label_tokens=["x"])
    assert result.error is None and any("label_tokens ignored" in w for w in result.warnings)


def _assert_is_ranking(ranking, column, top_n):
    """Highest first, ties by lower index, exactly the best `top_n` (NaN counts as lowest)."""

    def value(i):
        score = column[i]
        return -math.inf if math.isnan(score) else score

    indices = [entry.index for entry in ranking]
    assert len(indices) == min(top_n, len(column)) and len(set(indices)) == len(indices)
    for a, b in itertools.pairwise(indices):
        assert value(a) > value(b) or (value(a) == value(b) and a < b)
    rest = set(range(len(column))) - set(indices)
    if indices and rest:
        last = indices[-1]
        assert all(value(r) < value(last) or (value(r) == value(last) and r > last) for r in rest)
    for entry in ranking:
        assert entry.score == column[entry.index] or math.isnan(column[entry.index])


@given(
    column=st.lists(
        st.sampled_from([0.0, 0.5, 1.0, -2.0, math.nan, math.inf]) | st.floats(-5, 5), max_size=12
    ),
    top_n=st.integers(0, 14),
)
def test_rank_orders_by_score_then_index(column, top_n):
    _assert_is_ranking(rank([[v] for v in column], 0, top_n), column, top_n)


@pytest.mark.parametrize("top_n", [0, 2, 5, 50])
def test_top_n_ranks_the_jobs_own_scores(plain, top_n):
    result = plain.score(
        QUERY, ITEMS, label_tokens=["yes", "no"], apply_softmax=True, top_n=top_n, multi_item=False
    )
    assert len(result.scores) == len(ITEMS)  # scores stay complete
    _assert_is_ranking(result.ranking, [row[0] for row in result.scores], top_n)
    # items 0 and 4 are the same text: their scores tie exactly, and the lower index ranks first
    if top_n == 50:
        assert result.scores[0] == result.scores[4]
        order = [entry.index for entry in result.ranking]
        assert order.index(0) < order.index(4)


def test_rank_by_picks_the_label(plain):
    result = plain.score(QUERY, ITEMS, label_tokens=["yes", "no"], top_n=3, rank_by=1)
    _assert_is_ranking(result.ranking, [row[1] for row in result.scores], 3)
    bad = plain.score(QUERY, ITEMS, label_tokens=["yes", "no"], top_n=3, rank_by=2)
    assert bad.error.code is ErrorCode.INVALID_REQUEST and "rank_by" in bad.error.message


def test_without_top_n_there_is_no_ranking(plain):
    assert plain.score(QUERY, ITEMS, label_tokens=["yes"]).ranking is None
    assert plain.score(QUERY, [], label_tokens=["yes"], top_n=3).ranking == []


@pytest.mark.parametrize("num_labels", [1, 3])
def test_activations_of_a_classifier(scorer_for, tiny_models, num_labels):
    scorer = scorer_for("qwen3", "classification", num_labels)
    path = tiny_models.get("qwen3", "classification", num_labels)
    logits = torch.tensor(reference_scores(path, QUERY, ITEMS[:4]))
    expected = {
        "none": logits,
        "softmax": torch.softmax(logits, -1),
        "sigmoid": torch.sigmoid(logits),
    }
    for activation, want in expected.items():
        result = scorer.score(QUERY, ITEMS[:4], activation=activation, top_n=4)
        assert result.error is None
        assert torch.tensor(result.scores).double() == pytest.approx(want.double(), abs=1e-5)
        # the default relevance class of a classifier is its last one
        _assert_is_ranking(result.ranking, [row[-1] for row in result.scores], 4)
    via_flag = scorer.score(QUERY, ITEMS[:4], apply_softmax=True)
    assert torch.tensor(via_flag.scores).double() == pytest.approx(expected["softmax"].double(), abs=1e-5)


def test_activation_mixed_in_one_batch(scorer_for):
    """Rows of one forward take each job's own activation."""
    from kafka_scorer.wire.protocol import Job

    scorer = scorer_for("qwen3", "classification", 3)
    jobs = [Job(id=a, query=QUERY, items=ITEMS[:3], activation=a) for a in ("none", "softmax", "sigmoid")]
    results = scorer.score_jobs(jobs)
    logits = torch.tensor(results[0].scores)
    assert torch.tensor(results[1].scores) == pytest.approx(torch.softmax(logits, -1), abs=1e-6)
    assert torch.tensor(results[2].scores) == pytest.approx(torch.sigmoid(logits), abs=1e-6)


def test_activation_contradicting_apply_softmax_is_refused(scorer_for):
    result = scorer_for("qwen3", "classification").score("q", ["a"], apply_softmax=True, activation="sigmoid")
    assert result.error.code is ErrorCode.INVALID_REQUEST and "contradicts" in result.error.message


def test_activation_on_a_causal_lm_is_ignored_with_a_warning(plain):
    result = plain.score(QUERY, ITEMS, label_tokens=["yes"], activation="sigmoid")
    assert result.error is None and any("activation ignored" in w for w in result.warnings)


def test_classifier_rank_by_out_of_range(scorer_for):
    result = scorer_for("qwen3", "classification", 3).score("q", ["a"], top_n=1, rank_by=3)
    assert result.error.code is ErrorCode.INVALID_REQUEST and "3 classes" in result.error.message


def test_provenance_on_every_result(plain, reranker, tmp_path):
    ok = plain.score(QUERY, ITEMS, label_tokens=["yes"])
    failed = plain.score(QUERY, ITEMS)
    for result in (ok, failed):
        assert result.model_revision.startswith("sha256:") and result.dtype == "float32"
        assert result.template is None
    # stable across loads, blind to files that cannot change a score, changed by a weight change
    copy = tmp_path / "copy"
    shutil.copytree(reranker, copy)
    (copy / "README.md").write_text("notes")
    again = Scorer(str(copy), dtype="float32", device="cpu")
    assert again.engine.served.revision == plain.engine.served.revision
    weights = next(copy.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    changed = Scorer(str(copy), dtype="float32", device="cpu")
    assert changed.engine.served.revision != plain.engine.served.revision
    pinned = Scorer(str(reranker), dtype="float32", device="cpu", model_revision="hub:abc123")
    assert pinned.score(QUERY, ITEMS, label_tokens=["yes"]).model_revision == "hub:abc123"


def test_template_provenance_names_the_preset_and_hashes_its_text(reranker):
    from kafka_scorer.engine.prepare.templates import PRESETS

    scorer = Scorer(str(reranker), dtype="float32", device="cpu", template="qwen3-reranker")
    result = scorer.score(QUERY, ITEMS)
    text = PRESETS["qwen3-reranker"].text
    assert result.template.name == "qwen3-reranker"
    assert result.template.hash == hashlib.sha256(text.encode()).hexdigest()[:12]


def test_sigmoid_is_what_cross_encoder_predict_returns_by_default(minilm_cross_encoder):
    """The real MiniLM cross-encoder (one logit): sentence-transformers applies a sigmoid by default."""
    from sentence_transformers import CrossEncoder

    path = minilm_cross_encoder(1)
    pairs = [("how long is the nile", "The Nile is 6,650 km long."), ("how long is the nile", "Kafka.")]
    want = CrossEncoder(str(path), device="cpu").predict(pairs)
    scorer = Scorer(str(path), dtype="float32", device="cpu")
    result = scorer.score(pairs[0][0], [d for _, d in pairs], activation="sigmoid", top_n=2)
    assert [row[0] for row in result.scores] == pytest.approx([float(w) for w in want], abs=1e-5)
    assert [entry.index for entry in result.ranking] == sorted(range(2), key=lambda i: -float(want[i]))
