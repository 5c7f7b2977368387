"""Every SPEC error code the engine can produce, each triggered for real; errors are values, never raised."""

from __future__ import annotations

import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka_scorer.engine.prepare.text_bounds import text_char_bound
from kafka_scorer.engine.scorer import Scorer
from kafka_scorer.wire.protocol import ErrorCode, Job, Result

Q = "What is the capital of California?"


def prepared_error(scorer, job: Job) -> Result:
    result = scorer.engine.prepare(job, "job-1")
    assert isinstance(result, Result), "expected an error result, got a prepared job"
    assert result.scores is None and result.id == "job-1" and result.model == scorer.describe().model_name
    return result


@pytest.mark.parametrize(
    ("job", "code", "needle"),
    [
        (Job(query=Q, items=[[1, 2]], label_token_ids=[1]), ErrorCode.INVALID_REQUEST, "mix"),
        (Job(query=[1, 2], items=["text"], label_token_ids=[1]), ErrorCode.INVALID_REQUEST, "mix"),
        (Job(query=Q, items=["a", [1]], label_token_ids=[1]), ErrorCode.INVALID_REQUEST, "mix"),
        (Job(query=Q, items=["a"]), ErrorCode.INVALID_REQUEST, "label_token_ids"),
        (Job(query=Q, items=["a"], label_token_ids=[]), ErrorCode.INVALID_REQUEST, "label_token_ids"),
        (Job(query=Q, items=["a"], label_token_ids=[400]), ErrorCode.INVALID_REQUEST, "[0, 400)"),
        (Job(query=Q, items=["a"], label_token_ids=[-1]), ErrorCode.INVALID_REQUEST, "outside"),
        (Job(query=[1, 400], items=[[1]], label_token_ids=[1]), ErrorCode.INVALID_REQUEST, "query"),
        (Job(query=[1], items=[[1], [2, -5]], label_token_ids=[1]), ErrorCode.INVALID_REQUEST, "item 1"),
        (
            Job(query=[], items=[[1], []], label_token_ids=[1], multi_item=False),
            ErrorCode.INVALID_REQUEST,
            "no tokens",
        ),
        (
            Job(query=[], items=[[1], []], label_token_ids=[1], multi_item=True),
            ErrorCode.INVALID_REQUEST,
            "no tokens",
        ),
        (
            Job(query=Q, items=["a", "b"], label_token_ids=[1], item_first=True, multi_item=True),
            ErrorCode.UNSUPPORTED,
            "item_first",
        ),
        (
            Job(query=Q, items=["a"], label_token_ids=[1], model="other-model"),
            ErrorCode.MODEL_MISMATCH,
            "other-model",
        ),
    ],
)
def test_invalid_jobs_get_typed_errors(scorer_for, job, code, needle):
    result = prepared_error(scorer_for(), job)
    assert result.error.code is code
    assert needle in result.error.message


def test_error_names_the_bad_item(scorer_for):
    result = prepared_error(scorer_for(), Job(query=[1], items=[[1], [2], [900]], label_token_ids=[1]))
    assert result.error.item == 2


def test_too_many_items_and_too_long_pairs(scorer_for):
    scorer = scorer_for("qwen3", "causal", 2, max_items_per_job=3, max_pair_tokens=10)
    many = prepared_error(scorer, Job(query=[1], items=[[1]] * 4, label_token_ids=[1]))
    assert many.error.code is ErrorCode.TOO_LONG and "max_items_per_job" in many.error.message
    long_pair = prepared_error(scorer, Job(query=[1] * 6, items=[[1] * 4, [2] * 5], label_token_ids=[1]))
    assert long_pair.error.code is ErrorCode.TOO_LONG and long_pair.error.item == 1
    assert "`chunking: {}`" in long_pair.error.message and "`truncate: true`" in long_pair.error.message
    packed = prepared_error(
        scorer, Job(query=[1] * 6, items=[[1] * 3, [2] * 3], label_token_ids=[1], multi_item=True)
    )
    assert packed.error.code is ErrorCode.TOO_LONG
    # Without multi_item: true the same job falls back to single pairs, each within the limit.
    fallback = scorer.engine.prepare(Job(query=[1] * 6, items=[[1] * 3, [2] * 3], label_token_ids=[1]), "ok")
    assert not isinstance(fallback, Result) and not fallback.packed


def test_model_name_match_is_accepted(scorer_for):
    scorer = scorer_for()
    ok = scorer.score_jobs(
        [Job(query=Q, items=["a"], label_token_ids=[1], model=scorer.describe().model_name)]
    )[0]
    assert ok.error is None


def test_text_without_a_tokenizer_is_unsupported(tiny_models, tmp_path):
    path = tmp_path / "no-tokenizer"
    shutil.copytree(tiny_models.get(), path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (path / name).unlink()
    scorer = Scorer(str(path), dtype="float32", device="cpu")
    text = prepared_error(scorer, Job(query=Q, items=["a"], label_token_ids=[1]))
    assert text.error.code is ErrorCode.UNSUPPORTED
    ids = scorer.score_jobs([Job(query=[1, 2], items=[[3]], label_token_ids=[1])])[0]
    assert ids.error is None and len(ids.scores) == 1


def test_forward_failure_answers_every_job_with_internal(scorer_for, monkeypatch):
    scorer = scorer_for()
    jobs = [
        scorer.engine.prepare(Job(query=Q, items=["a", "b"], label_token_ids=[1]), f"j{i}") for i in range(3)
    ]

    def explode(batch):
        raise RuntimeError("device fell over")

    monkeypatch.setattr(scorer.describe().runner, "forward", explode)
    results = scorer.engine.run_batch(jobs)
    assert [r.id for r in results] == ["j0", "j1", "j2"]
    assert all(r.error.code is ErrorCode.INTERNAL and "device fell over" in r.error.message for r in results)


def test_no_items_is_a_valid_empty_result(scorer_for):
    result = scorer_for().score_jobs([Job(query=Q, items=[], label_token_ids=[1])])[0]
    assert result.error is None and result.scores == []


# ---- bounded intake (issue 12) -------------------------------------------------------------------


class _CountingTokenizer:
    """Wraps the served tokenizer and counts the characters it was asked to tokenize."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.chars = 0

    def __call__(self, text, **kwargs):
        self.chars += len(text) if isinstance(text, str) else sum(len(t) for t in text)
        return self.inner(text, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_text_longer_than_any_pair_can_hold_is_too_long_without_tokenizing(scorer_for, monkeypatch):
    scorer = scorer_for("qwen3", "causal", 2, max_pair_tokens=10)
    preparer = scorer.describe().kind.preparer
    bound = preparer.max_text_chars
    assert bound == 10 * preparer.longest_token
    spy = _CountingTokenizer(scorer.describe().loaded.tokenizer)
    monkeypatch.setattr(scorer.describe().loaded, "tokenizer", spy)
    huge = "x" * (bound + 1)
    for job, item in (
        (Job(query=Q[:5], items=["ok", huge], label_token_ids=[1]), 1),
        (Job(query=huge, items=["ok"], label_token_ids=[1]), None),
    ):
        result = prepared_error(scorer, job)
        assert result.error.code is ErrorCode.TOO_LONG and result.error.item == item
        assert "max_pair_tokens=10" in result.error.message
    assert spy.chars == 0, "the over-long text must be rejected before the tokenizer sees it"


def test_token_id_lists_over_the_pair_limit_are_too_long_before_per_token_checks(scorer_for):
    scorer = scorer_for("qwen3", "causal", 2, max_pair_tokens=10)
    result = prepared_error(scorer, Job(query=[1], items=[[10**9] * 11], label_token_ids=[1]))
    assert result.error.code is ErrorCode.TOO_LONG and result.error.item == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(min_size=1, max_size=200))
def test_the_character_bound_never_rejects_a_text_that_fits(scorer_for, text):
    """For any text, characters <= tokens x longest token: a text the bound rejects cannot fit."""
    scorer = scorer_for()
    preparer = scorer.describe().kind.preparer
    tokens = len(scorer.describe().loaded.tokenizer(text, add_special_tokens=False)["input_ids"])
    assert len(text) <= text_char_bound(max(tokens, 1), preparer.longest_token)


def test_label_count_is_capped_by_max_labels_per_job(scorer_for):
    scorer = scorer_for("qwen3", "causal", 2, max_labels_per_job=4)
    result = prepared_error(scorer, Job(query=Q, items=["a"], label_token_ids=[1, 2, 3, 4, 5]))
    assert result.error.code is ErrorCode.TOO_LONG and "max_labels_per_job=4" in result.error.message
    assert not isinstance(
        scorer.engine.prepare(Job(query=Q, items=["a"], label_token_ids=[1, 2, 3, 4]), "j"), Result
    )


def test_score_with_one_string_scores_one_item(scorer_for):
    """SGLang's `items: str` is one item; splitting it into characters would return len(str) rows."""
    scorer = scorer_for()
    one = scorer.score(Q, "Sacramento", label_token_ids=[1, 2])
    listed = scorer.score(Q, ["Sacramento"], label_token_ids=[1, 2])
    assert one.error is None and len(one.scores) == 1
    assert one.scores == listed.scores
    with pytest.raises(TypeError, match="lists of ints"):
        scorer.score([1, 2], [3, 4], label_token_ids=[1])
