"""How rankings, provenance and the submit flags' defaults are shown and applied (no broker, no model).

The end-to-end checks are tests/integration/test_submit.py and test_demo_rerank.py; these pin the
pieces on generated input: any item text, any label list a person can type.
"""

from __future__ import annotations

import argparse
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafka_scorer.cli.result_view import ITEM_WIDTH, provenance_lines, ranking_lines, shorten
from kafka_scorer.cli.submit import JobDefaults, label_list, non_negative
from kafka_scorer.wire.protocol import ErrorCode, ErrorInfo, Job, Ranked, Result, TemplateRef


@given(st.text())
def test_shorten_is_one_short_line_that_starts_the_text(text: str) -> None:
    short = shorten(text)
    folded = " ".join(text.split())
    assert len(short) <= ITEM_WIDTH and "\n" not in short
    assert short == folded or (short.endswith("…") and folded.startswith(short[:-1]))


def test_shorten_counts_token_ids() -> None:
    assert shorten([5, 6, 7]) == "<3 token ids>"


def test_shorten_shows_content_parts_with_image_markers() -> None:
    """An item or document with images (SPEC §11): its text parts, `[image]` for each image."""
    from kafka_scorer.wire.content import Content, ImageData, ImagePart, TextPart

    item = Content([TextPart("red  shoe"), ImagePart(ImageData(b"png")), TextPart("size 40")])
    assert shorten(item) == "red shoe [image] size 40"
    document = {
        "content": [{"type": "image", "image": b"png"}, {"type": "text", "text": "caption"}],
        "sku": 1,
    }
    assert shorten(document) == "[image] caption"
    job = Job(query="q", items=["a", item])
    result = Result(id="j", scores=[[0.1], [0.9]], ranking=[Ranked(1, 0.9), Ranked(0, 0.1)])
    assert ranking_lines(job, result) == ["1. #1 0.9000 red shoe [image] size 40", "2. #0 0.1000 a"]


def test_rerank_results_are_shown_like_a_ranking() -> None:
    """A job in the rerank shape (SPEC §10) is answered with `results`: the same lines, with an object
    document shown by its `text` field, or by its field names when it has none."""
    from kafka_scorer.wire.protocol import Reranked

    job = Job(query="q", documents=["plain text", {"title": "T", "text": "body text"}, {"title": "T"}])
    entries = [Reranked(1, 0.75), Reranked(2, 0.5), Reranked(0, 0.25)]
    result = Result(id="r", scores=[[0.25], [0.75], [0.5]], results=entries)
    assert ranking_lines(job, result) == [
        "1. #1 0.7500 body text",
        "2. #2 0.5000 {title}",
        "3. #0 0.2500 plain text",
    ]


def test_ranking_lines_name_rank_index_score_and_text() -> None:
    job = Job(query="q", items=["first item", "second item " * 5, [1, 2]])
    result = Result(
        id="j", scores=[[0.1], [0.9], [0.5]], ranking=[Ranked(1, 0.9), Ranked(2, 0.5), Ranked(7, 0.1)]
    )
    assert ranking_lines(job, result) == [
        f"1. #1 0.9000 {shorten(job.items[1])}",
        "2. #2 0.5000 <2 token ids>",
        "3. #7 0.1000",  # an index the job does not have: no text rather than a crash
    ]


def test_provenance_once_per_distinct_value_and_errors_left_out() -> None:
    ref = TemplateRef("qwen3-reranker", "abc123")
    ok = Result(id="a", scores=[], model_revision="sha256:1", template=ref, dtype="float32")
    other = Result(id="b", scores=[], model_revision="sha256:2", dtype="bfloat16")
    failed = Result(id="c", scores=None, error=ErrorInfo(code=ErrorCode.INTERNAL, message="x"))
    assert provenance_lines([ok, ok, None, failed]) == [
        "provenance: template qwen3-reranker (hash abc123), model_revision sha256:1, dtype float32"
    ]
    assert provenance_lines([ok, other, ok]) == [
        "provenance: template qwen3-reranker (hash abc123), model_revision sha256:1, dtype float32 "
        "(2 results)",
        "provenance: template none, model_revision sha256:2, dtype bfloat16 (1 result)",
    ]


labels = st.lists(st.text(min_size=1).filter(lambda s: "," not in s), min_size=1, max_size=5)


@given(labels)
def test_label_list_reads_commas_exactly_as_typed(values: list[str]) -> None:
    text = ",".join(values)
    if text.lstrip().startswith("["):
        return  # read as JSON: the next test
    assert label_list(text) == values


@given(st.lists(st.text(min_size=1), min_size=1, max_size=5))
def test_label_list_reads_a_json_array(values: list[str]) -> None:
    assert label_list(json.dumps(values)) == values


@given(st.text())
def test_label_list_never_fails_other_than_as_a_usage_error(text: str) -> None:
    try:
        result = label_list(text)
    except argparse.ArgumentTypeError:
        return
    assert result and all(isinstance(x, str) and x for x in result)


@pytest.mark.parametrize("text", ["", "yes,,no", ",", "[]", '["yes", 3]', "[not json"])
def test_label_list_refuses(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        label_list(text)


def test_non_negative() -> None:
    assert non_negative("0") == 0 and non_negative("7") == 7
    for bad in ("-1", "x", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError):
            non_negative(bad)


def test_defaults_fill_only_what_a_job_leaves_unset() -> None:
    defaults = JobDefaults(top_n=3, label_tokens=["yes", "no"], instruction="find it")
    plain = defaults.apply(Job(query="q", items=["a"]))
    assert (plain.top_n, plain.label_tokens, plain.instruction) == (3, ["yes", "no"], "find it")
    own = defaults.apply(Job(query="q", items=["a"], top_n=0, label_tokens=["no"], instruction="mine"))
    assert (own.top_n, own.label_tokens, own.instruction) == (0, ["no"], "mine")
    ids = defaults.apply(Job(query="q", items=["a"], label_token_ids=[5]))
    assert ids.label_tokens is None and ids.label_token_ids == [5]  # both would be invalid_request
    assert JobDefaults().apply(plain) is plain
