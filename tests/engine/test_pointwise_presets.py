"""The `mxbai-rerank-v2` and `bge-reranker-v2-gemma` presets against plain transformers, pair by pair,
with MIS on (`multi_item: true`: every job's items packed behind one copy of the shared prompt head).

The references are written here from the published code, not from the templates: each builds the
token ids the way its model's own code does, tokenizing the parts apart and joining the ids
(mixedbread-ai/mxbai-rerank's `MxbaiRerankV2.prepare_inputs`: chat prefix, "query: ...", newline,
"document: ...", newline, task prompt, chat suffix; FlagEmbedding's LLM reranker: BOS, "A: ...",
newline, "B: ...", newline, task prompt), runs a stock `AutoModelForCausalLM` on one pair, and reads
the last position's logits. Tiny random models from transformers' own Qwen2 / Gemma configs
(kafka_scorer/checkpoints/tiny_pointwise.py).

Where the two differ: a template's prompt is tokenized as one string, the published code tokenizes
the parts apart. With Qwen's pre-tokenizer a query or document ending in punctuation joins the newline
after it into one token in the whole string, so there the presets follow the prompt text, not the
published ids (docs/message-schema.md, Templates); the pair-by-pair tests use texts without that seam,
and one test pins the whole-string behaviour on texts with it.
"""

from __future__ import annotations

import pytest
import torch

from kafka_scorer.engine.scorer import Scorer

MXBAI_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
MXBAI_TASK = (
    "You are a search relevance expert who evaluates how well documents match search queries. For each "
    "query-document pair, carefully analyze the semantic relationship between them, then provide your "
    "binary relevance judgment (0 for not relevant, 1 for relevant).\nRelevance:"
)
BGE_TASK = (
    "Given a query A and a passage B, determine whether the passage contains an answer to the query by "
    "providing a prediction of either 'Yes' or 'No'."
)
QUERIES = ["Which river is longest", "capital of China"]
ITEMS = ["The Nile is the longest river", "Kafka topics have partitions", "Beijing", "yes"]
SEAM = ("Which river is longest?", ["The Nile is the longest river.", "yes!"])
"""Texts ending in punctuation before the prompt's newline: where joining the parts' ids and tokenizing
the whole prompt differ."""


class Published:
    """One pair at a time through stock transformers, ids joined as the model's own code joins them."""

    def __init__(self, path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    def ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    @torch.no_grad()
    def last_logits(self, ids: list[int]) -> torch.Tensor:
        return self.model(input_ids=torch.tensor([ids])).logits[0, -1].double()

    def mxbai(self, query: str, doc: str, whole: bool = False) -> float:
        """P('1') of the two-token softmax: sigmoid(logit('1') - logit('0')), what vLLM serves;
        `whole` tokenizes the joined text as one string instead of part by part."""
        prefix = f"<|im_start|>system\n{MXBAI_SYSTEM}<|im_end|>\n<|im_start|>user\n"
        suffix = "<|im_end|>\n<|im_start|>assistant\n"
        parts = [prefix, f"query: {query}", "\n", f"document: {doc}", "\n", MXBAI_TASK, suffix]
        parts = ["".join(parts)] if whole else parts
        logits = self.last_logits([i for part in parts for i in self.ids(part)])
        one, zero = self.ids("1")[0], self.ids("0")[0]
        return float(torch.sigmoid(logits[one] - logits[zero]))

    def bge(self, query: str, doc: str) -> tuple[float, float]:
        """The card's score (the logit of 'Yes') and the full-vocabulary P('Yes')."""
        parts = [f"A: {query}", "\n", f"B: {doc}", "\n", BGE_TASK]
        ids = [self.tokenizer.bos_token_id, *[i for part in parts for i in self.ids(part)]]
        logits = self.last_logits(ids)
        yes = self.ids("Yes")[0]
        return float(logits[yes]), float(torch.softmax(logits, -1)[yes])


@pytest.fixture(scope="module")
def mxbai(tmp_path_factory):
    from kafka_scorer.checkpoints.tiny_pointwise import build_tiny_mxbai

    return build_tiny_mxbai(tmp_path_factory.mktemp("mxbai"))


@pytest.fixture(scope="module")
def bge(tmp_path_factory):
    from kafka_scorer.checkpoints.tiny_pointwise import build_tiny_bge_gemma

    return build_tiny_bge_gemma(tmp_path_factory.mktemp("bge-gemma"))


def scorer(path, template: str) -> Scorer:
    return Scorer(str(path), dtype="float32", device="cpu", template=template, prefix_cache_mb=0)


@pytest.mark.parametrize("query", QUERIES)
def test_mxbai_equals_the_published_score_pair_by_pair(mxbai, query):
    published = Published(mxbai)
    result = scorer(mxbai, "mxbai-rerank-v2").score(
        query, ITEMS, multi_item=True, apply_softmax=True, top_n=len(ITEMS)
    )
    assert result.error is None, result.error
    want = [published.mxbai(query, item) for item in ITEMS]
    assert [row[0] for row in result.scores] == pytest.approx(want, abs=1e-5)
    assert [row[1] for row in result.scores] == pytest.approx([1 - p for p in want], abs=1e-5)
    assert [r.index for r in result.ranking] == sorted(range(len(ITEMS)), key=lambda i: (-want[i], i))


@pytest.mark.parametrize("query", QUERIES)
def test_mxbai_ranks_by_the_published_logit_difference_without_apply_softmax(mxbai, query):
    """Full-vocabulary rows; the ranking is the label's share, P('1') / (P('1') + P('0')), the same
    order (and value) as the published sigmoid of the logit difference."""
    published = Published(mxbai)
    result = scorer(mxbai, "mxbai-rerank-v2").score(query, ITEMS, multi_item=True, top_n=len(ITEMS))
    want = [published.mxbai(query, item) for item in ITEMS]
    expected = sorted(range(len(ITEMS)), key=lambda i: (-want[i], i))
    assert [r.index for r in result.ranking] == expected
    assert [r.score for r in result.ranking] == pytest.approx([want[i] for i in expected], abs=1e-5)


@pytest.mark.parametrize("query", QUERIES)
def test_bge_gemma_equals_the_published_forward_pair_by_pair(bge, query):
    """The row is P('Yes') over the full vocabulary at the published prompt's last position: its log
    is the card's logit less that position's log-partition (the card's raw logit is not a row)."""
    published = Published(bge)
    result = scorer(bge, "bge-reranker-v2-gemma").score(query, ITEMS, multi_item=True)
    assert result.error is None, result.error
    want = [published.bge(query, item) for item in ITEMS]
    assert [row[0] for row in result.scores] == pytest.approx([p for _, p in want], abs=1e-6)
    assert len(result.scores[0]) == 1


def test_at_a_punctuation_seam_the_preset_follows_the_prompt_text(mxbai):
    published = Published(mxbai)
    query, items = SEAM
    result = scorer(mxbai, "mxbai-rerank-v2").score(query, items, multi_item=True, apply_softmax=True)
    want = [published.mxbai(query, item, whole=True) for item in items]
    assert [row[0] for row in result.scores] == pytest.approx(want, abs=1e-5)


def test_the_presets_name_their_labels():
    from kafka_scorer.engine.prepare.templates import load_template

    mx, bg = load_template("mxbai-rerank-v2"), load_template("bge-reranker-v2-gemma")
    assert mx is not None and mx.label_tokens == ("1", "0") and not mx.has_instruction
    assert bg is not None and bg.label_tokens == ("Yes",) and not bg.has_instruction
