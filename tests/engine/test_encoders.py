"""Encoder cross-encoders on a real checkpoint: all-MiniLM-L6-v2's BERT weights and WordPiece tokenizer
under a seeded classification head (checkpoints/real_models.py), served through the normal loading path.

References, one pair at a time and independent of the engine: plain transformers
`model(**tokenizer(q, d))` and sentence-transformers' `CrossEncoder` (raw logits: identity activation),
both float32 on the CPU. The engine runs all pairs of many jobs in flat varlen forwards.
"""

from __future__ import annotations

import contextlib
import functools

import pytest
import torch

from kafka_scorer.engine.scorer import Scorer
from kafka_scorer.wire.protocol import ErrorCode, Job
from tests.engine.passages import LONG_PASSAGES, PASSAGES, QUERIES

TOLERANCE = 1e-5


@contextlib.contextmanager
def one_thread():
    """One pair at a time gains nothing from threads, and on a shared CI core they only spin."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class References:
    """Plain transformers and sentence-transformers on the same saved directory, cached per pair."""

    def __init__(self, path) -> None:
        from sentence_transformers import CrossEncoder
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.cross_encoder = CrossEncoder(str(path), device="cpu", activation_fn=torch.nn.Identity())
        self.transformers = functools.lru_cache(maxsize=None)(self._transformers)

    @torch.inference_mode()
    def _transformers(
        self, first: str, second: str, max_length: int | None = None, cut: str = "only_second"
    ) -> tuple[float, ...]:
        """`cut` names the side transformers may truncate: the item's."""
        if max_length is None:
            encoded = self.tokenizer(first, second, return_tensors="pt")
        else:
            encoded = self.tokenizer(
                first, second, truncation=cut, max_length=max_length, return_tensors="pt"
            )
        with one_thread():
            return tuple(self.model(**encoded).logits[0].tolist())

    def sentence_transformers(self, first: str, second: str) -> list[float]:
        with one_thread():
            scores = self.cross_encoder.predict([(first, second)], batch_size=1, show_progress_bar=False)
        return torch.as_tensor(scores).reshape(-1).tolist()

    @torch.inference_mode()
    def cls_hidden(self, first: str, second: str) -> torch.Tensor:
        with one_thread():
            encoded = self.tokenizer(first, second, return_tensors="pt")
            return self.model.base_model(**encoded).last_hidden_state[0, 0]


@pytest.fixture(scope="module", params=[1, 3], ids=["1-label", "3-labels"])
def served(request, minilm_cross_encoder):
    path = minilm_cross_encoder(request.param)
    scorer = Scorer(str(path), dtype="float32", device="cpu")
    return request.param, scorer, References(path)


def _pairs(num_labels: int) -> list[tuple[str, list[str]]]:
    """Half the queries against every passage for one label, a third for three (280 pairs in all, with
    both orders), which keeps the references' one-pair-at-a-time loop short."""
    queries = QUERIES[::2] if num_labels == 1 else QUERIES[1::3]
    return [(query, PASSAGES) for query in queries]


def _assert_close(got: list[list[float]], want: list[list[float]], what: str) -> None:
    diff = (torch.tensor(got, dtype=torch.float64) - torch.tensor(want, dtype=torch.float64)).abs().max()
    assert diff <= TOLERANCE, f"{what}: max |engine - reference| = {diff:.2e}"


@pytest.mark.parametrize("item_first", [False, True], ids=["query-first", "item-first"])
def test_text_pairs_equal_transformers_and_cross_encoder(served, item_first):
    num_labels, scorer, refs = served
    pairs = _pairs(num_labels)
    results = scorer.score_jobs(
        [Job(query=q, items=list(items), item_first=item_first) for q, items in pairs]
    )
    got, want, want_st = [], [], []
    for (query, items), result in zip(pairs, results):
        assert result.ok, result.error
        for index, (item, row) in enumerate(zip(items, result.scores)):
            first, second = (item, query) if item_first else (query, item)
            got.append(row)
            want.append(list(refs.transformers(first, second)))
            if index % 3 == 0:  # sentence-transformers is slower per call: every third pair
                want_st.append((row, refs.sentence_transformers(first, second)))
    assert all(len(row) == num_labels for row in got)
    # The comparison means something only if scores differ clearly between pairs.
    assert torch.tensor(want).std() > 0.1
    _assert_close(got, want, "transformers")
    _assert_close([g for g, _ in want_st], [w for _, w in want_st], "sentence-transformers CrossEncoder")


@pytest.mark.parametrize("item_first", [False, True], ids=["query-first", "item-first"])
def test_token_id_pairs_get_the_tokenizers_special_tokens(served, item_first):
    """Token ids without special tokens score exactly like the text pair the tokenizer encodes."""
    num_labels, scorer, refs = served
    tokenizer = refs.tokenizer

    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    pairs = _pairs(num_labels)[:4]
    jobs = [Job(query=ids(q), items=[ids(d) for d in items], item_first=item_first) for q, items in pairs]
    got, want = [], []
    for (query, items), result in zip(pairs, scorer.score_jobs(jobs)):
        assert result.ok, result.error
        got.extend(result.scores)
        want.extend(list(refs.transformers(*((d, query) if item_first else (query, d)))) for d in items)
    _assert_close(got, want, "token ids vs transformers text pair")


LIMIT = 48


@pytest.fixture(scope="module")
def short_limit(minilm_cross_encoder):
    path = minilm_cross_encoder(1)
    return Scorer(str(path), dtype="float32", device="cpu", max_pair_tokens=LIMIT), References(path)


@pytest.mark.parametrize("item_first", [False, True], ids=["query-first", "item-first"])
def test_truncate_cuts_the_item_to_the_pair_limit(short_limit, item_first):
    """`truncate: true` keeps the query and the special tokens and cuts the item from its end, exactly as
    transformers' `truncation="only_second"` (`only_first` with item_first) does."""
    scorer, refs = short_limit
    items = LONG_PASSAGES + PASSAGES[:3]
    queries = QUERIES[::2]
    jobs = [Job(query=q, items=items, item_first=item_first, truncate=True) for q in queries]
    got, want = [], []
    for query, result in zip(queries, scorer.score_jobs(jobs)):
        assert result.ok, result.error
        full = [len(refs.tokenizer(query, item)["input_ids"]) for item in items]
        assert result.truncated_items == [i for i, length in enumerate(full) if length > LIMIT]
        assert result.truncated_items  # the long passages are really cut
        for item, row in zip(items, result.scores):
            first, second = (item, query) if item_first else (query, item)
            got.append(row)
            cut = "only_first" if item_first else "only_second"
            want.append(list(refs.transformers(first, second, LIMIT, cut)))
    _assert_close(got, want, "truncated pairs vs transformers")


def test_truncate_defaults_to_the_worker_setting(short_limit, minilm_cross_encoder):
    scorer, refs = short_limit
    query, items = QUERIES[0], [PASSAGES[0], LONG_PASSAGES[0]]
    refused = scorer.score_jobs([Job(query=query, items=items)])[0]
    assert refused.error is not None and refused.error.code is ErrorCode.TOO_LONG
    assert refused.error.item == 1 and "truncate" in refused.error.message

    truncating = Scorer(
        str(minilm_cross_encoder(1)), dtype="float32", device="cpu", max_pair_tokens=LIMIT, truncate=True
    )
    by_default, opted_out = truncating.score_jobs(
        [Job(query=query, items=items), Job(query=query, items=items, truncate=False)]
    )
    assert by_default.ok and by_default.truncated_items == [1]
    _assert_close(by_default.scores, [list(refs.transformers(query, d, LIMIT)) for d in items], "truncated")
    assert opted_out.error is not None and opted_out.error.code is ErrorCode.TOO_LONG


def test_token_id_items_are_truncated_too(short_limit):
    scorer, refs = short_limit
    query = QUERIES[3]
    ids = [refs.tokenizer(text, add_special_tokens=False)["input_ids"] for text in (query, LONG_PASSAGES[1])]
    result = scorer.score_jobs([Job(query=ids[0], items=[ids[1]], truncate=True)])[0]
    assert result.ok and result.truncated_items == [0]
    _assert_close(result.scores, [list(refs.transformers(query, LONG_PASSAGES[1], LIMIT))], "token ids cut")


def test_pooled_hidden_state_is_the_vector_the_head_reads(served):
    """SPEC §6/§8: the final hidden state of [CLS], which BERT's pooler and classifier read."""
    _, scorer, refs = served
    query, items = QUERIES[4], PASSAGES[3:7]
    plain = scorer.score_jobs([Job(query=query, items=items)])[0]
    result = scorer.score_jobs([Job(query=query, items=items, return_pooled_hidden_states=True)])[0]
    assert result.ok and result.scores == plain.scores
    tensor = result.pooled_hidden_states
    assert tensor is not None and tensor.dtype == "float32" and tensor.shape == [len(items), 384]
    got = torch.frombuffer(bytearray(tensor.data), dtype=torch.float32).reshape(tensor.shape)
    want = torch.stack([refs.cls_hidden(query, item) for item in items])
    assert (got - want).abs().max() <= TOLERANCE


def test_multi_item_is_unsupported_and_label_ids_are_ignored(served):
    _, scorer, refs = served
    query, items = QUERIES[1], PASSAGES[:3]
    packed = scorer.score_jobs([Job(query=query, items=items, multi_item=True)])[0]
    assert packed.error is not None and packed.error.code is ErrorCode.UNSUPPORTED
    assert "bidirectional" in packed.error.message
    labelled = scorer.score_jobs([Job(query=query, items=items, label_token_ids=[1, 2])])[0]
    assert labelled.ok and labelled.warnings and "label_token_ids ignored" in labelled.warnings[0]
    _assert_close(labelled.scores, [list(refs.transformers(query, d)) for d in items], "labels ignored")


def test_the_model_kind_comes_from_the_config(served):
    _, scorer, _ = served
    assert scorer.describe().loaded.encoder is not None and scorer.describe().loaded.encoder.family == "bert"
    assert scorer.describe().loaded.max_positions == 512


def test_truncate_and_truncated_items_cross_the_wire(short_limit):
    """`truncate` decodes from a job's JSON; `truncated_items` is encoded when set and left out when empty."""
    import json

    from kafka_scorer.wire.protocol import decode_job, encode_result

    scorer, _ = short_limit
    body = json.dumps({"query": QUERIES[0], "items": [PASSAGES[0], LONG_PASSAGES[0]], "truncate": True})
    job, fmt = decode_job(body.encode())
    assert job.truncate is True
    result = scorer.score_jobs([job])[0]
    assert json.loads(encode_result(result, fmt))["truncated_items"] == [1]
    plain = scorer.score_jobs([Job(query=QUERIES[0], items=[PASSAGES[0]])])[0]
    assert "truncated_items" not in json.loads(encode_result(plain, fmt))
