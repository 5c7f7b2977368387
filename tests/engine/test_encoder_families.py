"""Every encoder family on a tiny random checkpoint with a tokenizer of its own kind
(checkpoints/tiny_models.py), against plain transformers one pair at a time; truncation for encoders and
decoders, fuzzed.

The real-weight comparison (BERT, with sentence-transformers as a second reference) is test_encoders.py.
"""

from __future__ import annotations

from functools import cache

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka_scorer.checkpoints.tiny_models import build_tiny_encoder
from kafka_scorer.engine.models.loaded import ModelLoadError
from kafka_scorer.engine.scorer import Scorer
from kafka_scorer.wire.protocol import ErrorCode, Job
from tests.engine.reference import reference_scores

QUERY = "Is the Rhine longer than 1,000 km? CAPITALS, accents: naïve café"
ITEMS = [
    "The Rhine runs about 1,230 km from the Swiss Alps to the North Sea.",
    "Crème brûlée!",
    "",
    "Kafka topics, partitions, offsets, consumers, producers, brokers and transactions. " * 2,
    "yes",
]
FAMILIES = ["bert", "roberta", "xlm-roberta", "distilbert", "electra", "modernbert", "modernbert-mean"]


def _arch(family: str) -> tuple[str, dict]:
    if family == "modernbert-mean":
        return "modernbert", {"classifier_pooling": "mean"}
    return family, {}


@cache
def _reference(path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    )
    return model.eval(), AutoTokenizer.from_pretrained(path)


@torch.inference_mode()
def _stock_logits(path, first: str, second: str) -> list[float]:
    """The batched call encodes ("q", "") as a pair with an empty segment, as CrossEncoder.predict does
    (a single call would drop an empty second text and encode `q` alone)."""
    model, tokenizer = _reference(path)
    return model(**tokenizer([first], [second], return_tensors="pt")).logits[0].tolist()


@pytest.fixture(scope="module")
def family_scorer(tiny_encoder):
    cache: dict = {}

    def get(family: str, backend: str = "cascade", **options):
        arch, overrides = _arch(family)
        path = tiny_encoder(arch, 3, **overrides)
        key = (family, backend, tuple(sorted(options.items())))
        if key not in cache:
            # "deterministic": the mode, with the CPU's own backend (engine/load/deterministic.py)
            deterministic = backend == "deterministic"
            cache[key] = Scorer(
                str(path),
                dtype="float32",
                device="cpu",
                attention_backend="auto" if deterministic else backend,
                deterministic=deterministic,
                **options,
            )
        return cache[key], path

    return get


def _assert_close(got, want, what: str, tolerance: float = 1e-5) -> None:
    diff = (torch.tensor(got, dtype=torch.float64) - torch.tensor(want, dtype=torch.float64)).abs().max()
    assert diff <= tolerance, f"{what}: max |engine - transformers| = {diff:.2e}"


@pytest.mark.parametrize("backend", ["cascade", "dense", "deterministic"])
@pytest.mark.parametrize("family", FAMILIES)
def test_family_scores_equal_the_stock_model(family_scorer, family, backend):
    """Both orders of a pair, an empty item, and pairs longer than ModernBERT's local window, all jobs in
    one flat varlen forward (in deterministic mode: padded to whole row blocks, fixed-shape matmuls)."""
    scorer, path = family_scorer(family, backend)
    assert scorer.describe().loaded.encoder is not None
    jobs = [Job(query=QUERY, items=ITEMS), Job(query=QUERY, items=ITEMS, item_first=True)]
    plain, swapped = scorer.score_jobs(jobs)
    assert plain.ok and swapped.ok, (plain.error, swapped.error)
    want = [_stock_logits(path, QUERY, item) for item in ITEMS]
    want_swapped = [_stock_logits(path, item, QUERY) for item in ITEMS]
    assert torch.tensor(want).std() > 0.1
    _assert_close(plain.scores, want, f"{family} query-first")
    _assert_close(swapped.scores, want_swapped, f"{family} item-first")


@pytest.mark.parametrize("family", FAMILIES)
def test_token_ids_are_joined_with_the_tokenizers_specials(family_scorer, family):
    scorer, path = family_scorer(family)
    _, tokenizer = _reference(path)

    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    result = scorer.score_jobs([Job(query=ids(QUERY), items=[ids(item) for item in ITEMS])])[0]
    assert result.ok, result.error
    _assert_close(result.scores, [_stock_logits(path, QUERY, item) for item in ITEMS], family)


@torch.inference_mode()
def test_roberta_positions_skip_pad_tokens_like_the_stock_model(family_scorer):
    """RoBERTa counts positions from padding_idx + 1 and gives a pad token the position padding_idx;
    a token-id item that contains the pad id must be scored the same way."""
    scorer, path = family_scorer("roberta")
    model, tokenizer = _reference(path)
    query = tokenizer("Who wrote it?", add_special_tokens=False)["input_ids"]
    item = tokenizer("Victor Hugo wrote it.", add_special_tokens=False)["input_ids"]
    item = [*item[:2], tokenizer.pad_token_id, *item[2:]]
    result = scorer.score_jobs([Job(query=query, items=[item])])[0]
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    ids = torch.tensor([[cls, *query, sep, sep, *item, sep]])
    want = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].tolist()
    _assert_close(result.scores, [want], "roberta with a pad token inside the item")


def test_pooled_hidden_state_of_mean_pooling_is_the_mean(family_scorer):
    scorer, path = family_scorer("modernbert-mean")
    model, tokenizer = _reference(path)
    result = scorer.score_jobs([Job(query=QUERY, items=ITEMS[:2], return_pooled_hidden_states=True)])[0]
    tensor = result.pooled_hidden_states
    got = torch.frombuffer(bytearray(tensor.data), dtype=torch.float32).reshape(tensor.shape)
    with torch.inference_mode():
        want = [
            model.base_model(**tokenizer(QUERY, item, return_tensors="pt"))[0][0].mean(0)
            for item in ITEMS[:2]
        ]
    assert (got - torch.stack(want)).abs().max() <= 1e-5


def test_a_causal_bert_is_refused(tmp_path):
    path = build_tiny_encoder(tmp_path / "causal-bert", "bert", overrides={"is_decoder": True})
    with pytest.raises(ModelLoadError, match="is_decoder"):
        Scorer(str(path), dtype="float32", device="cpu")


def test_decoder_classifiers_stay_decoders(scorer_for):
    assert scorer_for("qwen3", "classification").describe().loaded.encoder is None


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    query_len=st.integers(1, 30),
    item_lens=st.lists(st.integers(0, 60), min_size=1, max_size=4),
    limit=st.integers(8, 48),
    item_first=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_truncation_keeps_query_and_specials_and_cuts_the_item_end(
    family_scorer, query_len, item_lens, limit, item_first, seed
):
    """Fuzzed: any lengths and limits. Cut items are listed; every pair equals the stock model on
    `[CLS] q [SEP] item[:room] [SEP]` built by hand; a query that leaves no room is `too_long`."""
    scorer, path = family_scorer("bert", max_pair_tokens=limit)
    model, tokenizer = _reference(path)
    generator = torch.Generator().manual_seed(seed)
    low = len(tokenizer.all_special_ids)

    def draw(n: int) -> list[int]:
        return torch.randint(low, len(tokenizer), (n,), generator=generator).tolist()

    query, items = draw(query_len), [draw(n) for n in item_lens]
    result = scorer.score_jobs([Job(query=query, items=items, item_first=item_first, truncate=True)])[0]
    room = limit - query_len - 3
    if room < 0:
        assert result.error is not None and result.error.code is ErrorCode.TOO_LONG
        return
    assert result.ok, result.error
    assert result.truncated_items == [i for i, item in enumerate(items) if len(item) > room]
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    want = []
    for item in items:
        first, second = (item[:room], query) if item_first else (query, item[:room])
        ids = torch.tensor([[cls, *first, sep, *second, sep]])
        types = torch.tensor([[0] * (len(first) + 2) + [1] * (len(second) + 1)])
        with torch.inference_mode():
            want.append(model(input_ids=ids, token_type_ids=types).logits[0].tolist())
    _assert_close(result.scores, want, "truncated bert pairs")


@pytest.mark.parametrize("item_first", [False, True])
def test_decoder_truncation_is_a_shorter_item(scorer_for, tiny_models, item_first):
    """SPEC §8 for decoders: the cut item scores like the same shorter item sent whole, MIS or not."""
    scorer = scorer_for("qwen3", "causal", max_pair_tokens=24)
    tokenizer = scorer.describe().loaded.tokenizer
    query = "Is this review positive?"
    items = [
        "The food was great and the service was friendly. " * 3,
        "yes",
        "San Diego is in the south. " * 2,
    ]
    result = scorer.score_jobs(
        [Job(query=query, items=items, label_token_ids=[5, 9], item_first=item_first, truncate=True)]
    )[0]
    assert result.ok, result.error
    query_ids = tokenizer(query, add_special_tokens=not item_first)["input_ids"]
    item_ids = [tokenizer(item, add_special_tokens=item_first)["input_ids"] for item in items]
    room = 24 - len(query_ids)
    assert result.truncated_items == [i for i, ids in enumerate(item_ids) if len(ids) > room]
    cut = [ids[:room] for ids in item_ids]
    want = reference_scores(tiny_models.get("qwen3", "causal"), query_ids, cut, [5, 9], item_first=item_first)
    _assert_close(result.scores, want, "decoder truncation", tolerance=1e-4)


def test_overlong_text_is_cut_before_tokenizing_when_truncating(family_scorer):
    """A text longer than any pair can hold is cut by characters first (never tokenized whole)."""
    scorer, path = family_scorer("bert", max_pair_tokens=32)
    huge = "The Rhine runs from the Alps to the North Sea. " * 2000
    refused, cut = scorer.score_jobs(
        [Job(query=QUERY, items=[huge]), Job(query=QUERY, items=[huge], truncate=True)]
    )
    assert refused.error is not None and refused.error.code is ErrorCode.TOO_LONG
    assert cut.ok and cut.truncated_items == [0]
    model, tokenizer = _reference(path)
    with torch.inference_mode():
        encoded = tokenizer(QUERY, huge, truncation="only_second", max_length=32, return_tensors="pt")
        want = model(**encoded).logits[0].tolist()
    _assert_close(cut.scores, [want], "cut long text")


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_a_job_larger_than_the_budget_is_cut_with_its_token_types(family_scorer, family):
    """A job over `max_batch_tokens` runs as several forwards; each piece keeps its pairs' type ids."""
    scorer, path = family_scorer(family, max_batch_tokens=64)
    items = ITEMS * 3
    result = scorer.score_jobs([Job(query=QUERY, items=items), Job(query="yes", items=ITEMS)])
    assert all(r.ok for r in result), [r.error for r in result]
    _assert_close(result[0].scores, [_stock_logits(path, QUERY, item) for item in items], family)
    _assert_close(result[1].scores, [_stock_logits(path, "yes", item) for item in ITEMS], family)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    family=st.sampled_from(["bert", "roberta", "xlm-roberta"]),
    query=st.text(max_size=40),
    items=st.lists(st.text(max_size=60), min_size=1, max_size=3),
    item_first=st.booleans(),
)
def test_any_text_scores_like_the_tokenizers_own_pair(family_scorer, family, query, items, item_first):
    """Fuzzed text (any Unicode: blanks only, control characters, accents, emoji, empty strings): the
    pair the engine builds scores exactly like the stock tokenizer's pair encoding of the same texts."""
    scorer, path = family_scorer(family)
    result = scorer.score_jobs([Job(query=query, items=items, item_first=item_first)])[0]
    assert result.ok, result.error
    want = [_stock_logits(path, *((item, query) if item_first else (query, item))) for item in items]
    _assert_close(result.scores, want, f"{family} on fuzzed text")


def test_an_unknown_bidirectional_classifier_is_refused_not_scored_wrongly(tmp_path):
    """DeBERTa (mxbai-rerank v1's family) attends bidirectionally through its own attention code: served
    as a decoder its pairs would run as one causal stream. It is detected by behaviour and refused."""
    from transformers import DebertaV2Config

    from kafka_scorer.checkpoints.tiny_models import save_random_model

    config = DebertaV2Config(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=1,
        architectures=["DebertaV2ForSequenceClassification"],
    )
    path = save_random_model(config, "classification", tmp_path / "deberta")
    with pytest.raises(ModelLoadError, match="attends bidirectionally"):
        Scorer(str(path), dtype="float32", device="cpu")
