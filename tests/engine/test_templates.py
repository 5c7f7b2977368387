"""Prompt templates (SPEC §8, docs/message-schema.md "Templates") against an independent reference.

The reference builds each full prompt as text by plain string formatting (the Qwen3-Reranker model
card's layout is written out here again, not read from the code under test), tokenizes it as one
string with the tokenizer's special tokens, and runs stock transformers one pair at a time.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka_scorer.engine.prepare.templates import TemplateError, load_template
from kafka_scorer.engine.scorer import Scorer
from kafka_scorer.errors import SettingError
from kafka_scorer.wire.protocol import ErrorCode, Job
from tests.engine.reference import load_reference

CARD_SYSTEM = (
    "Judge whether the Document meets the requirements based on the Query and the Instruct provided. "
    'Note that the answer can only be "yes" or "no".'
)
CARD_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
QUERIES = ["Which river is longest?", "capital of China", "How far?  ", "Why?\n"]
ITEMS = ["The Nile is the longest river.", "Kafka topics have partitions.", "", "yes!\n"]


def card_prompt(query: str, item: str, instruction: str = CARD_INSTRUCTION) -> str:
    """Qwen3-Reranker's prompt as its model card builds it: prefix + instruction/query/document + suffix."""
    prefix = f"<|im_start|>system\n{CARD_SYSTEM}<|im_end|>\n<|im_start|>user\n"
    suffix = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    return prefix + f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {item}" + suffix


@torch.no_grad()
def reference_rows(path, prompts: list[str], labels: list[str], apply_softmax: bool) -> list[list[float]]:
    model, tokenizer, _ = load_reference(path)
    label_ids = [tokenizer.convert_tokens_to_ids(label.replace(" ", "Ġ")) for label in labels]
    rows = []
    for prompt in prompts:
        ids = torch.tensor([tokenizer(prompt)["input_ids"]])
        logits = model(input_ids=ids).logits[0, -1].double()
        if apply_softmax:
            rows.append(torch.softmax(logits[label_ids], -1).tolist())
        else:
            rows.append(torch.log_softmax(logits, -1)[label_ids].exp().tolist())
    return rows


def assert_close(rows, expected, atol=1e-5):
    assert len(rows) == len(expected)
    for got, want in zip(rows, expected):
        assert got == pytest.approx(want, abs=atol)


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    from kafka_scorer.checkpoints.tiny_models import build_tiny_reranker

    return build_tiny_reranker(tmp_path_factory.mktemp("reranker"))


@pytest.fixture(scope="module")
def preset_scorer(reranker):
    return Scorer(str(reranker), dtype="float32", device="cpu", template="qwen3-reranker", prefix_cache_mb=0)


@pytest.mark.parametrize("apply_softmax", [False, True])
@pytest.mark.parametrize("query", QUERIES)
def test_preset_scores_equal_the_model_card_prompt_run_alone(preset_scorer, reranker, query, apply_softmax):
    expected = reference_rows(reranker, [card_prompt(query, i) for i in ITEMS], ["yes", "no"], apply_softmax)
    for multi_item in (None, False):
        result = preset_scorer.score(query, ITEMS, apply_softmax=apply_softmax, multi_item=multi_item)
        assert result.error is None, result.error
        assert_close(result.scores, expected)


def test_the_seam_case_is_exercised(preset_scorer):
    """Qwen's pre-tokenizer joins a query's closing `?` with the template's next newline: without the
    seam repair the pieces would tokenize differently from the whole prompt (the test above would fail)."""
    tokenizer = preset_scorer.describe().loaded.tokenizer
    joined = tokenizer(card_prompt("Which river is longest?", "x"))["input_ids"]
    assert tokenizer.convert_tokens_to_ids("?Ċ") in joined


def test_packing_computes_the_shared_prompt_once(preset_scorer, reranker):
    _, tokenizer, _ = load_reference(reranker)
    full = [tokenizer(card_prompt(QUERIES[0], item))["input_ids"] for item in ITEMS]
    packed = preset_scorer.score(QUERIES[0], ITEMS)
    pairs = preset_scorer.score(QUERIES[0], ITEMS, multi_item=False)
    assert pairs.prompt_tokens == sum(len(ids) for ids in full)
    saved, rest = divmod(pairs.prompt_tokens - packed.prompt_tokens, len(ITEMS) - 1)
    head = len(tokenizer(card_prompt(QUERIES[0], "").partition("\n<Document>")[0])["input_ids"])
    assert rest == 0 and head - 2 <= saved <= head  # all of the prompt up to the query, but a seam token


_TEXT = st.text(st.sampled_from(list("ab cd?!.,:\n\t yes no É€😀<>{}")), max_size=24)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=_TEXT, items=st.lists(_TEXT, min_size=1, max_size=4), instruction=st.none() | _TEXT)
def test_packed_tokens_are_the_whole_prompt_tokenized_as_one_string(preset_scorer, query, items, instruction):
    job = Job(query=query, items=items, instruction=instruction, multi_item=True)
    prepared = preset_scorer.engine.prepare(job, "fuzz")
    tokenizer = preset_scorer.describe().loaded.tokenizer
    used = CARD_INSTRUCTION if instruction is None else instruction
    for index, item in enumerate(items):
        whole = tokenizer(card_prompt(query, item, used))["input_ids"]
        assert prepared.query + prepared.items[index] == whole


def test_instruction_fills_the_template(preset_scorer, reranker):
    instruction = "Find passages about rivers"
    expected = reference_rows(
        reranker, [card_prompt("longest?", i, instruction) for i in ITEMS], ["yes", "no"], True
    )
    result = preset_scorer.score("longest?", ITEMS, apply_softmax=True, instruction=instruction)
    assert_close(result.scores, expected)
    default = preset_scorer.score("longest?", ITEMS, apply_softmax=True)
    assert default.scores != result.scores


def test_custom_template_file_with_instruction_after_the_item(tiny_models, tmp_path):
    """A plain model with a BOS-adding tokenizer and a JSON template: the BOS leads the shared part."""
    path = tiny_models.get("qwen3", "causal")
    text = "Q: {query}\nP: {item}\n{instruction} Answer:"
    spec = {"text": text, "instruction": "Relevant?", "label_tokens": ["yes", "no"], "name": "ab-test"}
    file = tmp_path / "ab.json"
    file.write_text(json.dumps(spec))
    scorer = Scorer(str(path), dtype="float32", device="cpu", template=str(file))
    _, tokenizer, _ = load_reference(path)
    candidates = (" yes", " no", " is", " the", " and", " capital")
    labels = [t for t in candidates if len(tokenizer(t, add_special_tokens=False)["input_ids"]) == 1][:2]
    assert len(labels) == 2
    prompts = [
        text.replace("{query}", "capital?").replace("{item}", i).replace("{instruction}", "Relevant?")
        for i in ITEMS
    ]
    expected = reference_rows(path, prompts, labels, False)
    for multi_item in (None, False):
        result = scorer.score("capital?", ITEMS, label_tokens=labels, multi_item=multi_item)
        assert result.error is None, result.error
        assert_close(result.scores, expected)
        assert result.template.name == "ab-test"
        assert result.template.hash == hashlib.sha256(text.encode()).hexdigest()[:12]


def test_plain_text_template_file(tiny_models, tmp_path):
    file = tmp_path / "plain.txt"
    file.write_text("{query} => {item}")
    template = load_template(str(file))
    assert template.name == "plain" and template.label_tokens == ()
    scorer = Scorer(
        str(tiny_models.get("qwen3", "causal")), dtype="float32", device="cpu", template=str(file)
    )
    result = scorer.score("q", ["a"])
    assert result.error.code is ErrorCode.INVALID_REQUEST and "label_tokens" in result.error.message


@pytest.mark.parametrize(
    "text, needle",
    [("{query} only", "{item}"), ("{item} then {query}", "before"), ("{query}{query}{item}", "{query}")],
)
def test_unusable_templates_are_refused_at_start(tmp_path, text, needle):
    file = tmp_path / "bad.txt"
    file.write_text(text)
    with pytest.raises(TemplateError, match=needle.replace("{", r"\{").replace("}", r"\}")):
        load_template(str(file))


def test_an_unknown_template_setting_is_a_settings_error():
    from pydantic import ValidationError

    from kafka_scorer.config import Settings

    with pytest.raises(ValidationError, match="qwen3-reranker"):
        Settings(model="m", template="qwen4-reranker")


def test_a_template_on_an_encoder_is_refused(tiny_encoder):
    with pytest.raises(SettingError) as info:
        Scorer(str(tiny_encoder("bert")), dtype="float32", device="cpu", template="qwen3-reranker")
    assert info.value.setting == "template"


def test_an_instruction_too_long_to_fit_is_too_long_before_tokenizing(preset_scorer):
    limit = preset_scorer.describe().kind.preparer.max_text_chars
    result = preset_scorer.score("q", ["a"], instruction="x" * (limit + 1))
    assert result.error.code is ErrorCode.TOO_LONG and result.error.message.startswith("instruction:")


def test_item_first_under_a_template_is_an_invalid_request(preset_scorer):
    result = preset_scorer.score("q", ["a"], item_first=True)
    assert result.error.code is ErrorCode.INVALID_REQUEST and "item_first" in result.error.message


def test_token_id_jobs_bypass_the_template(preset_scorer, reranker):
    _, tokenizer, _ = load_reference(reranker)
    yes_no = [tokenizer.convert_tokens_to_ids(t) for t in ("yes", "no")]
    result = preset_scorer.score([5, 6, 7], [[8, 9], [10]], label_token_ids=yes_no)
    assert result.template is None
    assert any("template not applied" in w for w in result.warnings)
    plain = Scorer(str(reranker), dtype="float32", device="cpu")
    assert_close(result.scores, plain.score([5, 6, 7], [[8, 9], [10]], label_token_ids=yes_no).scores)


@pytest.mark.parametrize("query", QUERIES[:2])
def test_ranking_without_apply_softmax_follows_the_model_cards_score(preset_scorer, reranker, query):
    """Issue 26: `scores` stay the full-vocabulary P(yes), P(no) the job asked for, but `ranking` orders
    by the card's relevance, P(yes) / (P(yes) + P(no)), and reports it."""
    card = reference_rows(reranker, [card_prompt(query, i) for i in ITEMS], ["yes", "no"], apply_softmax=True)
    raw = reference_rows(reranker, [card_prompt(query, i) for i in ITEMS], ["yes", "no"], apply_softmax=False)
    result = preset_scorer.score(query, ITEMS, top_n=len(ITEMS))
    assert result.error is None, result.error
    assert_close(result.scores, raw)
    expected = sorted(range(len(ITEMS)), key=lambda i: (-card[i][0], i))
    assert [r.index for r in result.ranking] == expected
    assert [r.score for r in result.ranking] == pytest.approx([card[i][0] for i in expected], abs=1e-5)


def test_token_id_jobs_and_apply_softmax_jobs_rank_by_their_rows(preset_scorer):
    """No template applied (token ids): the row's own value ranks, as before."""
    result = preset_scorer.score([5, 6, 7], [[8, 9], [10], [11, 12]], label_token_ids=[3, 4], top_n=3)
    assert [r.score for r in result.ranking] == sorted((row[0] for row in result.scores), reverse=True)
