"""Hostile input on the late-interaction kind: typed errors, never a crash; checkpoints and settings it
cannot serve are refused at load with the reason."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka_scorer.engine.late_interaction.preparer import LateJob
from kafka_scorer.engine.models.loaded import ModelLoadError
from kafka_scorer.engine.scorer import Scorer
from kafka_scorer.errors import SettingError
from kafka_scorer.wire.protocol import Chunking, ErrorCode, Job, Result


@pytest.mark.parametrize(
    "fields",
    [
        {"label_token_ids": [1]},
        {"label_tokens": ["yes"]},
        {"multi_item": True},
        {"item_first": True},
        {"return_pooled_hidden_states": True},
        {"apply_softmax": True},
        {"activation": "sigmoid"},
    ],
)
def test_fields_without_meaning_here_are_unsupported(colbert_scorer, fields):
    result = colbert_scorer().score("a query", ["a document"], **fields)
    assert result.error is not None and result.error.code == ErrorCode.UNSUPPORTED


def test_mixed_and_out_of_vocabulary_inputs_are_invalid(colbert_scorer):
    scorer = colbert_scorer()
    mixed = scorer.score_jobs([Job(query="q", items=["a", [1, 2]])])[0]
    assert mixed.error.code == ErrorCode.INVALID_REQUEST
    vocab = scorer.describe().loaded.input_vocab_size
    bad = scorer.score([1, 2], [[3], [vocab + 5]])
    assert bad.error.code == ErrorCode.INVALID_REQUEST and bad.error.item == 1
    assert scorer.score("q", ["d"], rank_by=1).error.code == ErrorCode.INVALID_REQUEST


_text = st.text(max_size=60)
_ids = st.lists(st.integers(min_value=-5, max_value=600), max_size=60)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    query=st.one_of(_text, _ids),
    items=st.lists(st.one_of(_text, _ids), max_size=5),
    multi_item=st.sampled_from([None, False, True]),
    top_n=st.one_of(st.none(), st.integers(0, 8)),
    rank_by=st.one_of(st.none(), st.integers(0, 2)),
    instruction=st.one_of(st.none(), _text),
    truncate=st.sampled_from([None, False, True]),
    chunking=st.one_of(
        st.none(),
        st.builds(
            Chunking,
            window=st.one_of(st.none(), st.integers(1, 50)),
            overlap=st.integers(0, 20),
            aggregate=st.sampled_from(["max", "mean", "first"]),
        ),
    ),
)
def test_any_job_is_prepared_or_answered_with_a_typed_error(colbert_scorer, query, items, **fields):
    scorer = colbert_scorer()
    prepared = scorer.engine.prepare(Job(query=query, items=items, **fields), "fuzz")
    if isinstance(prepared, Result):
        assert prepared.error is None or isinstance(prepared.error.code, ErrorCode)
        return
    assert isinstance(prepared, LateJob)
    [result] = scorer.engine.run_batch([prepared])
    assert result.error is None and len(result.scores) == len(items)
    assert all(len(row) == 1 and row[0] == row[0] for row in result.scores)  # one finite column


_field = st.sampled_from(["text", "title", "body"])
_document = st.one_of(
    _text,
    st.dictionaries(_field, st.one_of(_text, st.integers(), st.lists(_text, max_size=2)), max_size=3),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    query=st.one_of(_text, _ids),
    documents=st.lists(_document, max_size=5),
    rank_fields=st.one_of(st.none(), st.lists(_field, max_size=2)),
    return_documents=st.booleans(),
    top_n=st.one_of(st.none(), st.integers(0, 8)),
)
def test_any_rerank_shaped_job_is_scored_or_answered_with_a_typed_error(
    colbert_scorer, query, documents, **fields
):
    """The rerank shape: never `internal` (issue 40: every such job failed `prepare failed: TypeError`);
    a scored one answers `results`, every document or the best `top_n` in order, echoed when asked."""
    scorer = colbert_scorer()
    [result] = scorer.score_jobs([Job(query=query, documents=documents, **fields)])
    if result.error is not None:
        assert result.error.code is ErrorCode.INVALID_REQUEST, result.error
        return
    assert len(result.scores) == len(documents) and result.ranking is None
    scores = [row[0] for row in result.scores]
    by_rule = sorted(range(len(documents)), key=lambda i: (-scores[i], i))  # highest first, ties by index
    assert [entry.index for entry in result.results] == by_rule[: fields["top_n"]]
    for entry in result.results:
        assert entry.relevance_score == result.scores[entry.index][0]
        sent = documents[entry.index]
        echoed = {"text": sent} if isinstance(sent, str) else sent
        assert entry.document == (echoed if fields["return_documents"] else None)


def test_a_template_setting_is_refused(tiny_colbert):
    with pytest.raises(SettingError, match="template"):
        Scorer(str(tiny_colbert()), device="cpu", dtype="float32", template="qwen3-reranker")


def test_chunking_with_truncate_or_a_bad_overlap_is_invalid(colbert_scorer):
    scorer = colbert_scorer()
    both = scorer.score("q", ["d"], chunking=Chunking(window=8), truncate=True)
    assert both.error.code == ErrorCode.INVALID_REQUEST
    overlap = scorer.score("q", ["a long document " * 20], chunking=Chunking(window=8, overlap=8))
    assert overlap.error.code == ErrorCode.INVALID_REQUEST
    many = colbert_scorer(max_chunks_per_job=2).score("q", ["word " * 200], chunking=Chunking(window=8))
    assert many.error.code == ErrorCode.TOO_LONG


def test_a_projection_it_cannot_reproduce_is_refused(tiny_colbert, tmp_path):
    import shutil

    path = tmp_path / "colbert"
    shutil.copytree(tiny_colbert(), path)
    config = json.loads((path / "1_Dense" / "config.json").read_text())
    config["activation_function"] = "torch.nn.modules.activation.Tanh"
    (path / "1_Dense" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="activation"):
        Scorer(str(path), device="cpu", dtype="float32")


def test_the_revision_covers_the_projection(tiny_colbert, tmp_path):
    """Two checkpoints alike but for their Dense weights report different `model_revision`s."""
    import shutil

    from safetensors.torch import load_file, save_file

    path = tmp_path / "colbert"
    shutil.copytree(tiny_colbert(), path)
    before = Scorer(str(path), device="cpu", dtype="float32").engine.served.revision
    weights = load_file(str(path / "1_Dense" / "model.safetensors"))
    save_file({k: v * 2 for k, v in weights.items()}, str(path / "1_Dense" / "model.safetensors"))
    assert Scorer(str(path), device="cpu", dtype="float32").engine.served.revision != before
