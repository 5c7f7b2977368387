"""Long items (SPEC §9 `chunking`) against an independent reference.

The reference splits an item's token ids by the rule docs/message-schema.md states ("Long items"),
written out again here as a loop (never imported from engine/prepare/chunking.py), scores every window as a
plain pair with stock transformers one pair at a time (tests/engine/reference.py), and aggregates the
windows' rows itself. The engine must give the same rows within 1e-5 (float32 on the CPU), for
`max`, `mean` and `first`, with and without MIS, with overlap 0 and > 0, and for items just under, at
and over the limit.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch

from kafka_scorer.engine.pack.tensors import from_wire
from kafka_scorer.engine.scorer import Scorer
from kafka_scorer.wire.protocol import Chunking, ErrorCode, Job, Result
from tests.engine.reference import load_reference, reference_hidden, reference_scores

TOLERANCE = 1e-5
LIMIT = 32
QUERY = [21, 22, 23, 24, 25, 26, 27, 28, 29, 30]
ROOM = LIMIT - len(QUERY)
LABELS = [3, 44, 120]


def rule_windows(length: int, window: int, overlap: int) -> list[tuple[int, int]]:
    """docs/message-schema.md: windows of `window` tokens from 0, each starting `window - overlap`
    after the previous, until one reaches the end; an item that fits is one window."""
    if length <= window:
        return [(0, length)]
    windows, start = [], 0
    while True:
        end = min(start + window, length)
        windows.append((start, end))
        if end == length:
            return windows
        start += window - overlap


def rule_aggregate(
    rows: list[list[float]], how: str, rank_by: int, normalised: bool = False
) -> tuple[list[float], int | None]:
    """The item's row and the window it came from (None for mean). `normalised`: `max` picks by the
    label's share of the row, P(yes) / (P(yes) + P(no)), as a templated job's ranking does."""
    if how == "first":
        return rows[0], 0
    if how == "mean":
        return [sum(column) / len(rows) for column in zip(*rows)], None

    def score(row: list[float]) -> float:
        return row[rank_by] / sum(row) if normalised else row[rank_by]

    best = 0
    for index, row in enumerate(rows):
        if score(row) > score(rows[best]):
            best = index
    return rows[best], best


def item_ids(length: int, seed: int) -> list[int]:
    return [40 + (seed * 37 + 11 * i) % 300 for i in range(length)]


# just under, at and over the pair limit (by one, and by several windows), and a short one
LENGTHS = [ROOM - 1, ROOM, ROOM + 1, 3 * ROOM + 5, 4]
ITEMS = [item_ids(n, seed) for seed, n in enumerate(LENGTHS)]


def assert_rows_close(got, want) -> None:
    diff = (torch.tensor(got, dtype=torch.float64) - torch.tensor(want, dtype=torch.float64)).abs().max()
    assert diff <= TOLERANCE, f"max |engine - reference| = {diff:.2e}"


@pytest.fixture(scope="module")
def causal(tiny_models):
    path = tiny_models.get("qwen3", "causal")
    return Scorer(str(path), dtype="float32", device="cpu", max_pair_tokens=LIMIT), path


@functools.cache
def _reference_row(path, query: tuple, window: tuple, labels: tuple | None) -> tuple[float, ...]:
    rows = reference_scores(path, list(query), [list(window)], list(labels) if labels else None)
    return tuple(rows[0])


def reference_job(path, query, items, window, overlap, how, rank_by, labels=None):
    """(rows, {item: (windows, chosen window, span)}) by the rule, one plain pair per window."""
    rows, chunks = [], {}
    for index, item in enumerate(items):
        ranges = rule_windows(len(item), window, overlap)
        window_rows = [
            list(_reference_row(path, tuple(query), tuple(item[s:e]), tuple(labels) if labels else None))
            for s, e in ranges
        ]
        row, chosen = rule_aggregate(window_rows, how, rank_by)
        rows.append(row)
        if len(ranges) > 1:
            chunks[index] = (len(ranges), chosen, None if chosen is None else ranges[chosen])
    return rows, chunks


@pytest.mark.parametrize("multi_item", [True, False], ids=["mis", "pairs"])
@pytest.mark.parametrize("overlap", [0, 3])
@pytest.mark.parametrize("window", [None, 9])
@pytest.mark.parametrize("how", ["max", "mean", "first"])
def test_causal_windows_equal_the_reference(causal, how, window, overlap, multi_item):
    scorer, path = causal
    chunking = Chunking(window=window, overlap=overlap, aggregate=how)
    result = scorer.score(QUERY, ITEMS, label_token_ids=LABELS, multi_item=multi_item, chunking=chunking)
    assert result.ok, result.error
    want, chunks = reference_job(path, QUERY, ITEMS, window or ROOM, overlap, how, 0, LABELS)
    assert_rows_close(result.scores, want)
    got = {c.index: (c.windows, c.window, c.span) for c in result.chunks}
    assert got == chunks
    assert all(c.unit == "tokens" for c in result.chunks)
    if window is None:
        assert set(got) == {2, 3}  # under and at the limit are scored as today
    # every window ran: the query once per packed piece, or once per window as pairs
    windows = sum(len(rule_windows(len(item), window or ROOM, overlap)) for item in ITEMS)
    item_tokens = sum(e - s for item in ITEMS for s, e in rule_windows(len(item), window or ROOM, overlap))
    ran = result.prompt_tokens + result.cached_tokens  # the prefix cache may serve some of the query
    if multi_item:
        assert ran < windows * len(QUERY) + item_tokens
    else:
        assert ran == windows * len(QUERY) + item_tokens


def test_mis_packs_all_windows_of_all_items_behind_one_query(causal):
    """SPEC §9 with §5: the windows are items of one packed sequence, so the query runs once."""
    scorer, _ = causal
    job = Job(query=QUERY, items=ITEMS, label_token_ids=LABELS, chunking=Chunking(window=9, overlap=3))
    prepared = scorer.engine.prepare(job, "j")
    windows = sum(len(rule_windows(len(item), 9, 3)) for item in ITEMS)
    assert prepared.packed and len(prepared.items) == windows
    assert prepared.num_tokens == len(QUERY) + sum(map(len, prepared.items))
    assert prepared.num_tokens > LIMIT  # longer than one pair may be: the windows are what must fit


@pytest.mark.parametrize("multi_item", [True, False], ids=["mis", "pairs"])
def test_the_token_budget_counts_and_cuts_the_windows(tiny_models, multi_item):
    """The scheduler and the worker's backpressure read `num_tokens`: every window's tokens. A chunked
    job larger than the budget is cut between windows into several forwards, with the same rows."""
    from kafka_scorer.engine.pack.scheduler import plan_forwards

    path = tiny_models.get("qwen3", "causal")
    small = Scorer(str(path), dtype="float32", device="cpu", max_pair_tokens=LIMIT, max_batch_tokens=40)
    job = Job(
        query=QUERY, items=ITEMS, label_token_ids=LABELS, chunking=Chunking(window=9), multi_item=multi_item
    )
    prepared = small.engine.prepare(job, "b")
    item_tokens = sum(e - s for item in ITEMS for s, e in rule_windows(len(item), 9, 0))
    windows = sum(len(rule_windows(len(item), 9, 0)) for item in ITEMS)
    assert prepared.num_tokens == (len(QUERY) if multi_item else windows * len(QUERY)) + item_tokens
    forwards = plan_forwards([prepared], small.engine.max_batch_tokens)
    assert len(forwards) > 1 and all(sum(p.num_tokens for _, p in group) <= 40 for group in forwards)
    (result,) = small.engine.run_batch([prepared])
    want, _ = reference_job(path, QUERY, ITEMS, 9, 0, "max", 0, LABELS)
    assert_rows_close(result.scores, want)


def test_an_item_that_fits_is_scored_as_today(causal):
    """As one pair: bit for bit as pairs; packed (a job with `chunking` may pack past the pair limit,
    where the plain job runs pairs), within MIS's rounding (SPEC §5)."""
    scorer, _ = causal
    plain = scorer.score(QUERY, ITEMS[:2], label_token_ids=LABELS)
    as_pairs = scorer.score(QUERY, ITEMS[:2], label_token_ids=LABELS, chunking=Chunking(), multi_item=False)
    assert (
        as_pairs.scores == plain.scores
        and as_pairs.chunks == []
        and as_pairs.prompt_tokens + as_pairs.cached_tokens == plain.prompt_tokens + plain.cached_tokens
    )
    packed = scorer.score(QUERY, ITEMS[:2], label_token_ids=LABELS, chunking=Chunking())
    assert packed.chunks == []
    assert_rows_close(packed.scores, plain.scores)


def test_text_items_have_character_spans(causal):
    scorer, path = causal
    _, tokenizer, _ = load_reference(path)
    query, item = "rivers of the world", "The Nile flows north through eleven countries. " * 4
    own = tokenizer(item, add_special_tokens=False)["input_ids"]
    offsets = tokenizer(item, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    query_ids = tokenizer(query)["input_ids"]
    window = LIMIT - len(query_ids)
    result = scorer.score(query, [item], label_token_ids=LABELS, chunking=Chunking(overlap=2))
    assert result.ok, result.error
    ranges = rule_windows(len(own), window, 2)
    rows = [reference_scores(path, query_ids, [own[s:e]], LABELS)[0] for s, e in ranges]
    row, chosen = rule_aggregate(rows, "max", 0)
    assert_rows_close(result.scores, [row])
    (chunk,) = result.chunks
    start, end = ranges[chosen]
    assert (chunk.windows, chunk.window, chunk.unit) == (len(ranges), chosen, "characters")
    assert chunk.span == (offsets[start][0], offsets[end - 1][1])


@pytest.mark.parametrize("how", ["max", "mean"])
def test_item_first_text_windows_each_lead_with_the_special_tokens(tiny_models, how):
    """`item_first`: each window leads its pair and gets the BOS a leading text gets (SPEC §4)."""
    path = tiny_models.get("llama", "causal")
    scorer = Scorer(str(path), dtype="float32", device="cpu", max_pair_tokens=LIMIT)
    _, tokenizer, _ = load_reference(path)
    query, item = "is this about rivers?", "The Nile flows north through eleven countries. " * 3
    bos = tokenizer.bos_token_id
    assert tokenizer(item)["input_ids"][0] == bos  # the case: a leading text gets a BOS
    own = tokenizer(item, add_special_tokens=False)["input_ids"]
    query_ids = tokenizer(query, add_special_tokens=False)["input_ids"]
    window = LIMIT - len(query_ids) - 1
    result = scorer.score(
        query,
        [item, "short"],
        label_token_ids=LABELS,
        item_first=True,
        chunking=Chunking(overlap=3, aggregate=how),
    )
    assert result.ok, result.error
    ranges = rule_windows(len(own), window, 3)
    rows = [
        reference_scores(path, query_ids, [[bos, *own[s:e]]], LABELS, item_first=True)[0] for s, e in ranges
    ]
    short = reference_scores(path, query, ["short"], LABELS, item_first=True)[0]
    assert_rows_close(result.scores, [rule_aggregate(rows, how, 0)[0], short])
    assert [c.windows for c in result.chunks] == [len(ranges)]


def test_classification_and_pooled_hidden_states_follow_the_winning_window(scorer_for, tiny_models):
    path = tiny_models.get("qwen3", "classification", 2)
    scorer = Scorer(str(path), dtype="float32", device="cpu", max_pair_tokens=LIMIT)
    for how in ("max", "mean"):
        result = scorer.score(
            QUERY,
            ITEMS,
            chunking=Chunking(window=9, overlap=2, aggregate=how),
            return_pooled_hidden_states=True,
        )
        assert result.ok, result.error
        want, _ = reference_job(path, QUERY, ITEMS, 9, 2, how, 1)  # rank_by: the last class
        assert_rows_close(result.scores, want)
        hidden = from_wire(result.pooled_hidden_states)
        assert list(hidden.shape) == [len(ITEMS), 64]
        for index, item in enumerate(ITEMS):
            ranges = rule_windows(len(item), 9, 2)
            vectors = reference_hidden(path, QUERY, [item[s:e] for s, e in ranges])
            chunk = next((c for c in result.chunks if c.index == index), None)
            expected = vectors.mean(0) if how == "mean" else vectors[0 if chunk is None else chunk.window]
            assert torch.allclose(hidden[index], expected, atol=1e-5, rtol=0)


def test_top_n_ranks_the_aggregated_rows(causal):
    scorer, path = causal
    result = scorer.score(QUERY, ITEMS, label_token_ids=LABELS, chunking=Chunking(window=9), top_n=3)
    want, _ = reference_job(path, QUERY, ITEMS, 9, 0, "max", 0, LABELS)
    order = sorted(range(len(want)), key=lambda i: (-want[i][0], i))[:3]
    assert [r.index for r in result.ranking] == order
    assert [r.score for r in result.ranking] == [result.scores[i][0] for i in order]


# ---- limits and mistakes -------------------------------------------------------------------------


def test_windows_over_the_cap_are_too_long_naming_the_setting(tiny_models):
    path = tiny_models.get("qwen3", "causal")
    scorer = Scorer(str(path), dtype="float32", device="cpu", max_pair_tokens=LIMIT, max_chunks_per_job=5)
    fits = scorer.score(QUERY, [item_ids(25, 1)], label_token_ids=LABELS, chunking=Chunking(window=5))
    assert fits.ok and fits.chunks[0].windows == 5
    over = scorer.score(QUERY, [item_ids(26, 1)], label_token_ids=LABELS, chunking=Chunking(window=5))
    assert over.error.code is ErrorCode.TOO_LONG and "max_chunks_per_job=5" in over.error.message
    # an item far longer than the cap allows is refused by its length, before any per-token work
    huge = scorer.score(QUERY, [item_ids(LIMIT * 5 + 1, 1)], label_token_ids=LABELS, chunking=Chunking())
    assert huge.error.code is ErrorCode.TOO_LONG and "max_chunks_per_job" in huge.error.message


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"truncate": True, "chunking": Chunking()}, "truncate: true and chunking"),
        ({"chunking": Chunking(window=4, overlap=4)}, "overlap 4 must be below the window, 4 tokens"),
        ({"chunking": Chunking(overlap=ROOM)}, "(what fits the pair limit)"),
    ],
)
def test_contradictions_are_invalid_requests(causal, fields, needle):
    scorer, _ = causal
    result = scorer.score(QUERY, ITEMS, label_token_ids=LABELS, **fields)
    assert result.error.code is ErrorCode.INVALID_REQUEST and needle in result.error.message


def test_worker_default_applies_unless_the_job_says_truncate(tiny_models):
    path = tiny_models.get("qwen3", "causal")
    scorer = Scorer(
        str(path), dtype="float32", device="cpu", max_pair_tokens=LIMIT, chunking=Chunking(aggregate="first")
    )
    by_default = scorer.score(QUERY, ITEMS, label_token_ids=LABELS)
    assert by_default.ok and [c.index for c in by_default.chunks] == [2, 3]
    truncated = scorer.score(QUERY, ITEMS, label_token_ids=LABELS, truncate=True)
    assert truncated.ok and truncated.chunks == [] and truncated.truncated_items == [2, 3]
    # `first` is the truncation to the window: the same rows
    assert_rows_close(by_default.scores, truncated.scores)
    refused = scorer.score(QUERY, ITEMS, label_token_ids=LABELS, truncate=False)
    assert refused.error.code is ErrorCode.TOO_LONG


def test_a_window_never_passes_the_pair_limit(causal):
    """`window` larger than what fits beside the query is clamped to what fits."""
    scorer, path = causal
    result = scorer.score(QUERY, ITEMS, label_token_ids=LABELS, chunking=Chunking(window=1000))
    want, _ = reference_job(path, QUERY, ITEMS, ROOM, 0, "max", 0, LABELS)
    assert_rows_close(result.scores, want)


def test_nan_scores_rank_below_numbers_when_choosing_the_window() -> None:
    from kafka_scorer.engine.prepare.chunking import ChunkPlan, WindowedItem, aggregate

    rows = [[math.nan], [0.25], [0.5], [0.5]]
    spans = [(0, 4), (3, 7), (6, 10), (9, 12)]
    out, _, report = aggregate(ChunkPlan("max", [4], [WindowedItem(0, spans, "tokens")]), rows, 0, None)
    assert out == [[0.5]]  # ties: the earlier window
    assert (report[0].window, report[0].span, report[0].windows) == (2, (6, 10), 4)


# ---- templates and multi-byte text ---------------------------------------------------------------

TEMPLATE_LIMIT = 160
MULTI_BYTE = "naïve café — 東京の川 😀 résumé, Ünïcödé, Ελληνικά. " * 2


@pytest.fixture(scope="module")
def templated(tmp_path_factory):
    from kafka_scorer.checkpoints.tiny_models import build_tiny_reranker

    path = build_tiny_reranker(tmp_path_factory.mktemp("chunk-reranker"))
    scorer = Scorer(
        str(path), dtype="float32", device="cpu", template="qwen3-reranker", max_pair_tokens=TEMPLATE_LIMIT
    )
    return scorer, path


@functools.cache
def _card_row(path, prompt: str) -> tuple[float, ...]:
    from tests.engine.test_templates import reference_rows

    return tuple(reference_rows(path, [prompt], ["yes", "no"], False)[0])


@pytest.mark.parametrize("multi_item", [True, False], ids=["mis", "pairs"])
@pytest.mark.parametrize(("how", "overlap"), [("max", 0), ("mean", 4), ("first", 4), ("max", 5)])
def test_templated_windows_are_the_whole_prompt_of_each_windows_text(templated, how, overlap, multi_item):
    """Under a template a window is the item's characters its tokens cover, scored as the model card's
    whole prompt with that text as the document; spans are character offsets into the item."""
    from tests.engine.test_templates import card_prompt

    scorer, path = templated
    _, tokenizer, _ = load_reference(path)
    query, window = "Which river is longest?", 12
    items = [MULTI_BYTE, "The Nile is the longest river.", "Kafka " * 12]
    result = scorer.score(
        query, items, chunking=Chunking(window=window, overlap=overlap, aggregate=how), multi_item=multi_item
    )
    assert result.ok, result.error
    want_rows, want_chunks, inside_a_character = [], {}, False
    for index, item in enumerate(items):
        encoded = tokenizer(item, add_special_tokens=False, return_offsets_mapping=True)
        offsets = encoded["offset_mapping"]
        ranges = rule_windows(len(encoded["input_ids"]), window, overlap)
        spans = [(offsets[s][0], offsets[e - 1][1]) for s, e in ranges]
        inside_a_character |= any(offsets[s][0] < offsets[s - 1][1] for s, _ in ranges[1:])
        rows = [list(_card_row(path, card_prompt(query, item[a:b]))) for a, b in spans]
        row, chosen = rule_aggregate(rows, how, 0, normalised=True)  # the model card's score
        want_rows.append(row)
        if len(ranges) > 1:
            want_chunks[index] = (len(ranges), chosen, None if chosen is None else spans[chosen])
    assert inside_a_character  # some window starts inside a multi-byte character: the case is exercised
    assert_rows_close(result.scores, want_rows)
    assert {c.index: (c.windows, c.window, c.span) for c in result.chunks} == want_chunks
    assert all(c.unit == "characters" for c in result.chunks)
    for chunk in result.chunks:
        if chunk.span is not None:
            text = items[chunk.index][slice(*chunk.span)]
            assert text.encode("utf-8").decode("utf-8") == text and text  # whole characters, not empty


def test_templated_window_null_fits_the_pair_limit(templated):
    scorer, _ = templated
    job = Job(query="Which river is longest?", items=[MULTI_BYTE * 3], chunking=Chunking())
    prepared = scorer.engine.prepare(job, "t")
    assert not isinstance(prepared, Result), prepared.error
    assert prepared.chunks is not None and len(prepared.items) > 1
    assert all(len(prepared.query) + len(part) <= TEMPLATE_LIMIT for part in prepared.items)
    assert scorer.engine.run_batch([prepared])[0].ok


# ---- the worker's settings -----------------------------------------------------------------------


def test_the_chunking_setting_is_read_by_the_job_fields_own_decoder(monkeypatch):
    from pydantic import ValidationError

    from kafka_scorer.config import EngineSettings

    for key in [k for k in __import__("os").environ if k.upper().startswith("KAFKA_SCORER_")]:
        monkeypatch.delenv(key)
    from kafka_scorer.wire.protocol import parse_chunking

    assert parse_chunking(EngineSettings().engine_config().chunking) is None
    setting = EngineSettings(chunking='{"aggregate": "mean", "overlap": 8}')
    assert parse_chunking(setting.engine_config().chunking) == Chunking(
        window=None, overlap=8, aggregate="mean"
    )
    assert EngineSettings(max_chunks_per_job=9).max_chunks_per_job == 9
    for bad in ('{"aggregate": "sum"}', '{"window": 0}', '{"stride": 4}', "max"):
        with pytest.raises(ValidationError, match="chunking"):
            EngineSettings(chunking=bad)
    with pytest.raises(ValidationError, match="truncate, chunking"):
        EngineSettings(chunking="{}", truncate=True)


def test_the_worker_builds_its_engine_with_the_chunking_setting(tiny_models, monkeypatch):
    from kafka_scorer.config import EngineSettings

    for key in [k for k in __import__("os").environ if k.upper().startswith("KAFKA_SCORER_")]:
        monkeypatch.delenv(key)
    settings = EngineSettings(
        model=str(tiny_models.get("qwen3", "causal")),
        dtype="float32",
        device="cpu",
        max_pair_tokens=LIMIT,
        chunking='{"window": 9}',
        max_chunks_per_job=3,
    )
    scorer = Scorer.from_config(settings.engine_config())
    result = scorer.score(QUERY, ITEMS[:1], label_token_ids=LABELS)
    assert result.ok and result.chunks[0].windows == len(rule_windows(len(ITEMS[0]), 9, 0)) == 3
    capped = scorer.score(QUERY, ITEMS[3:4], label_token_ids=LABELS)
    assert capped.error.code is ErrorCode.TOO_LONG and "max_chunks_per_job=3" in capped.error.message
