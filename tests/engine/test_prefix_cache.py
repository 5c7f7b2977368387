"""The prefix cache (issue 20, SPEC §9 `cached_tokens`): a recurring prompt head is computed once per
worker, and a cache hit never changes a score.

Scores are checked against the independent reference (plain transformers, each whole pair alone) across
batch compositions where some jobs hit, some miss, some fill a prefix for their batch-mates and some
evict older prefixes; the forward's token count shows a hit's prefix is not run again.
"""

from __future__ import annotations

import json
import random

import pytest
import torch

from kafka_scorer.engine.pack.prefix_cache import PrefixCache, PrefixEntry
from kafka_scorer.wire.protocol import Job
from tests.engine.reference import reference_scores

LABELS = [3, 44, 120]
QUERY_LEN = 300
"""Long enough that a 1 MiB cache of the tiny model (512 bytes a token) holds only 6 of these prefixes."""


def max_diff(a, b) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


def token_jobs(seed: int, queries: list[list[int]], picks: list[int], labels) -> list[Job]:
    """Jobs on the given queries: 1-4 items each (some empty), packed, pairs or left to the engine."""
    rng = random.Random(seed)
    jobs = []
    for n, pick in enumerate(picks):
        count = rng.randrange(1, 5)
        items = [[rng.randrange(5, 380) for _ in range(rng.randrange(0, 7))] for _ in range(count)]
        multi = [None, False, True][n % 3] if count > 1 else None
        jobs.append(
            Job(id=f"{seed}-{n}", query=queries[pick], items=items, label_token_ids=labels, multi_item=multi)
        )
    return jobs


@pytest.mark.parametrize("backend", ["dense", "cascade"])
@pytest.mark.parametrize("kind", ["causal", "classification"])
def test_cached_scores_equal_the_reference_through_hits_misses_and_evictions(
    scorer_for, tiny_models, backend, kind
):
    cached = scorer_for("qwen3", kind, attention_backend=backend, prefix_cache_mb=1)
    plain = scorer_for("qwen3", kind, attention_backend=backend)
    labels = LABELS if kind == "causal" else None
    rng = random.Random(7)
    queries = [[rng.randrange(5, 380) for _ in range(QUERY_LEN + q)] for q in range(9)]
    rounds = [
        [0, 1, 0, 1, 2],  # cold: queries 0 and 1 fill on their second job, batch-mates hit that one copy
        [0, 3, 1, 3, 2, 4],  # 0 and 1 hit the cache, 2 fills, 3 fills in-batch, 4 is seen once
        [5, 6, 7, 8, 5, 6, 7, 8, 4],  # more prefixes than the cache holds: the oldest are evicted
        [1, 0, 8, 2],  # evicted or kept, every answer is the same
    ]
    served = 0
    for number, picks in enumerate(rounds):
        jobs = token_jobs(number, queries, picks, labels)
        got = cached.score_jobs(jobs)
        want = plain.score_jobs(jobs)
        for job, hit, miss in zip(jobs, got, want):
            assert hit.error is None and miss.error is None
            reference = reference_scores(tiny_models.get("qwen3", kind, 2), job.query, job.items, labels)
            assert max_diff(hit.scores, miss.scores) <= 1e-5
            assert max_diff(hit.scores, reference) <= 1e-5
            assert hit.prompt_tokens + hit.cached_tokens == miss.prompt_tokens
            assert miss.cached_tokens == 0
            served += hit.cached_tokens
    stats = cached.describe().prefix_cache
    assert served > 0 and stats.hits > 0 and stats.misses > 0
    assert stats.evictions > 0
    assert stats.bytes <= stats.capacity_bytes == 1 << 20


def count_forward_tokens(scorer) -> list[int]:
    """Token counts of every forward from now on, read at the embedding (what the model really runs)."""
    counts: list[int] = []
    embed = scorer.describe().loaded.model.get_input_embeddings()
    embed.register_forward_hook(lambda module, args, out: counts.append(int(args[0].numel())))
    return counts


@pytest.mark.parametrize("backend", ["dense", "cascade", "flex"])  # flex: eager on the CPU, compiled on CUDA
def test_a_hit_does_not_run_its_prefix_again(scorer_for, backend):
    scorer = scorer_for(prefix_cache_mb=4, attention_backend=backend)
    counts = count_forward_tokens(scorer)
    query = list(range(10, 10 + 200))
    items = [[5, 6, 7], [8, 9], [11]]
    first = scorer.score(query, items, label_token_ids=LABELS)  # seen once: head alone, kept (room)
    second = scorer.score(query, items, label_token_ids=LABELS)  # hits
    third = scorer.score(query, items, label_token_ids=LABELS, multi_item=False)  # hits, as pairs too
    head, rest = len(query) - 1, 1 + 6  # the head alone, then the query's last token and the items
    assert counts == [head, rest, rest, 3 * 1 + 6]  # each pair: the query's last token, its item
    assert (first.cached_tokens, second.cached_tokens) == (0, head)
    assert first.scores == second.scores  # the same hit forward: the same bits
    assert third.cached_tokens == 3 * (len(query) - 1) and third.prompt_tokens == 9
    assert max_diff(third.scores, first.scores) <= 1e-5


def test_one_batch_attends_to_one_copy_of_a_shared_prefix(scorer_for):
    scorer = scorer_for(prefix_cache_mb=4, attention_backend="cascade")
    counts = count_forward_tokens(scorer)
    query = list(range(20, 20 + 100))
    jobs = [Job(id=str(n), query=query, items=[[n + 5]], label_token_ids=LABELS) for n in range(4)]
    results = scorer.score_jobs(jobs)
    # the head is computed once, alone (for the first job; kept, the cache has room), then every
    # job's pair runs its query's last token and its item against it; the cache served none of them
    # the head (it held nothing before the batch), so none reports it cached (test_cached_tokens.py)
    assert counts == [len(query) - 1, 4 * 2]
    assert [r.cached_tokens for r in results] == [0, 0, 0, 0]
    assert [r.cached_tokens for r in scorer.score_jobs(jobs)] == [99, 99, 99, 99]


def test_a_template_head_is_shared_across_queries(tiny_models, tmp_path):
    from kafka_scorer.engine.scorer import Scorer

    rubric = " ".join(f"rule {n}: be fair and exact." for n in range(15))
    file = tmp_path / "judge.json"
    file.write_text(json.dumps({"text": rubric + " {instruction}\nQ: {query}\nA: {item}\nVerdict:"}))
    path = tiny_models.get()
    scorer = Scorer(str(path), dtype="float32", device="cpu", template=str(file), prefix_cache_mb=4)
    questions = ["why is the sky blue?", "how far is the moon?", "what is rain?", "is ice water?"]
    results = [scorer.score(q, ["because of light", "no idea"], label_token_ids=LABELS) for q in questions]
    for question, result in zip(questions, results):
        job = Job(query=question, items=["because of light", "no idea"], label_token_ids=LABELS)
        prepared = scorer.engine.prepare(job, "x")
        want = reference_scores(path, prepared.query, prepared.items, LABELS)
        assert max_diff(result.scores, want) <= 1e-5
    heads = [
        scorer.engine.prepare(Job(query=q, items=["x"], label_token_ids=LABELS), "h").prefix_marks[-1]
        for q in questions
    ]
    assert min(heads) > 100 and len(set(heads)) == 1  # one cut for every query
    assert [r.cached_tokens for r in results] == [0, heads[1], heads[2], heads[3]]


@pytest.mark.parametrize("multi_item", [None, False], ids=["packed", "pairs"])
@pytest.mark.parametrize("others", [0, 2])
def test_a_repeated_query_is_cached_whole_after_the_template_head(tiny_models, tmp_path, others, multi_item):
    """A query that comes back is served from the cache up to its last token, whether the template's
    head is already cached (after `others` other queries) or not: the head in the cache does not keep
    the longer shared part from being admitted in its turn."""
    from kafka_scorer.engine.scorer import Scorer

    file = tmp_path / "judge.txt"
    file.write_text("a rubric to judge by, rule after rule; " * 6 + "{instruction}\nQ: {query}\nA: {item}")
    path = tiny_models.get()
    scorer = Scorer(str(path), dtype="float32", device="cpu", template=str(file), prefix_cache_mb=4)
    for n in range(others):
        scorer.score(f"another question number {n}?", ["x"], label_token_ids=LABELS)
    query, items = "what is the boiling point of water at sea level?", ["100 C", "50 C"]
    results = [scorer.score(query, items, label_token_ids=LABELS, multi_item=multi_item) for _ in range(4)]
    prepared = scorer.engine.prepare(Job(query=query, items=items, label_token_ids=LABELS), "p")
    whole, head = prepared.prefix_marks
    pairs = 1 if multi_item is None else len(items)  # pairs count their cached head once each
    assert whole > head
    assert results[-1].cached_tokens == whole * pairs
    if others:  # the head was cached before: no run of the query computes it again, the whole is
        # extended from it (the head's states, then the query's own, computed once for all the pairs)
        first = whole * pairs - (whole - head)
        assert [r.cached_tokens for r in results] == [first] + [whole * pairs] * 3
    assert all(result.scores == results[0].scores for result in results)
    want = reference_scores(path, prepared.query, prepared.items, LABELS)
    for result in results:
        assert max_diff(result.scores, want) <= 1e-5


def test_entries_are_not_shared_between_templated_and_token_id_jobs(tiny_models, tmp_path):
    from kafka_scorer.engine.scorer import Scorer

    file = tmp_path / "t.txt"
    file.write_text("a long shared head of the prompt, " * 10 + "{query} | {item}")
    scorer = Scorer(
        str(tiny_models.get()), dtype="float32", device="cpu", template=str(file), prefix_cache_mb=4
    )
    for _ in range(3):
        templated = scorer.score("q", ["x"], label_token_ids=LABELS)
    assert templated.cached_tokens > 0
    ids = scorer.engine.prepare(Job(query="q", items=["x", "y"], label_token_ids=LABELS), "p").query
    by_ids = scorer.score(ids, [[7]], label_token_ids=LABELS)  # same leading ids, no template: no hit
    assert by_ids.cached_tokens == 0


def test_encoders_never_use_the_cache(tiny_encoder):
    from kafka_scorer.engine.scorer import Scorer

    scorer = Scorer(str(tiny_encoder("bert")), dtype="float32", device="cpu", prefix_cache_mb=64)
    assert scorer.describe().prefix_cache is None
    assert scorer.describe().fields["prefix_cache_mb"] == "0"
    for _ in range(3):
        result = scorer.score("a query seen again and again", ["item"])
    assert result.cached_tokens == 0


def entry(tokens: int, fill: float = 0.0) -> PrefixEntry:
    item = PrefixEntry(((), tuple(range(tokens))), num_layers=1)
    item.store(0, torch.full((1, tokens, 4), fill), torch.full((1, tokens, 4), fill))
    return item


def test_lru_evicts_the_least_recently_used_first():
    size = entry(8).nbytes
    cache = PrefixCache(capacity_bytes=2 * size)
    a, b = entry(8), PrefixEntry(((), tuple(range(1, 9))), 1)
    b.store(0, torch.zeros(1, 8, 4), torch.zeros(1, 8, 4))
    cache.insert(a)
    cache.insert(b)
    assert cache.lookup(a.key) is a  # a is now the most recently used
    c = PrefixEntry(((), tuple(range(2, 10))), 1)
    c.store(0, torch.zeros(1, 8, 4), torch.zeros(1, 8, 4))
    cache.insert(c)
    assert cache.lookup(b.key) is None and cache.lookup(a.key) is a and cache.lookup(c.key) is c
    stats = cache.stats()
    assert (stats.evictions, stats.entries, stats.bytes, stats.peak_bytes) == (1, 2, 2 * size, 2 * size)


def test_an_unfilled_entry_is_never_kept():
    cache = PrefixCache(capacity_bytes=1 << 20)
    cache.insert(PrefixEntry(((), (1, 2, 3)), num_layers=2))  # a forward that failed before filling it
    assert cache.lookup(((), (1, 2, 3))) is None


def naive_block_attention(q, k, v, prefix_k, prefix_v, start, length, scale, softcap=None):
    """One causal block against [prefix | its own earlier tokens], one softmax, written out plainly."""
    heads, kv_heads = q.shape[0], prefix_k.shape[0]
    rep = heads // kv_heads
    keys = torch.cat([prefix_k, k[:, start : start + length]], dim=1).repeat_interleave(rep, 0)
    values = torch.cat([prefix_v, v[:, start : start + length]], dim=1).repeat_interleave(rep, 0)
    scores = q[:, start : start + length] @ keys.transpose(1, 2) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    cached = prefix_k.shape[1]
    later = torch.ones(length, length, dtype=torch.bool).triu(1)
    scores[:, :, cached:] = scores[:, :, cached:].masked_fill(later, float("-inf"))
    return torch.softmax(scores, -1) @ values  # [H, length, d]


@pytest.mark.parametrize("softcap", [None, 5.0])
def test_hit_attention_paths_equal_the_plain_softmax(softcap):
    """The fused CPU path and the explicit path (soft-capped layers, other devices) both give the
    softmax over the prefix and the block's own earlier keys, for padded blocks of several lengths."""
    from kafka_scorer.engine.attention import cached as hits

    torch.manual_seed(0)
    heads, kv_heads, dim, total, prefix = 4, 2, 8, 40, 13
    q, k, v = (
        torch.randn(heads, total, dim),
        torch.randn(kv_heads, total, dim),
        torch.randn(kv_heads, total, dim),
    )
    prefix_k, prefix_v = torch.randn(kv_heads, prefix, dim), torch.randn(kv_heads, prefix, dim)
    blocks = [(0, 9), (9, 4), (13, 1), (14, 26)]
    group = hits._hit_group(0, blocks, pin=False)
    rows = [x.transpose(0, 1).reshape(total, -1) for x in (q, k, v)]
    explicit = hits._attend_slice(
        rows, group.gather, group.own_mask, group.size, group.length, prefix_k, prefix_v, heads, 0.3, softcap
    )
    outputs = [explicit]
    if softcap is None:
        outputs.append(
            hits._attend_fused(rows, group.gather, group.size, group.length, prefix_k, prefix_v, heads, 0.3)
        )
    for out in outputs:
        got = out.index_select(0, group.valid).view(-1, heads, dim)
        positions = group.positions.tolist()
        for start, length in blocks:
            want = naive_block_attention(q, k, v, prefix_k, prefix_v, start, length, 0.3, softcap)
            rows_of_block = [positions.index(p) for p in range(start, start + length)]
            assert torch.allclose(got[rows_of_block].transpose(0, 1), want, atol=1e-5)


@pytest.mark.parametrize("multi_item", [True, False])
def test_a_job_cut_into_several_forwards_hits_in_each(scorer_for, tiny_models, multi_item):
    """A job larger than the token budget runs as pieces in several forwards: each piece hits, and the
    job's `cached_tokens` adds them up."""
    scorer = scorer_for(prefix_cache_mb=4, max_batch_tokens=160)
    query = list(range(30, 30 + 60))
    items = [[5 + n, 6 + n, 7 + n] * 5 for n in range(12)]  # 12 items of 15 tokens: several pieces
    for _ in range(2):  # sighted, then filled
        scorer.score(query, items[:2], label_token_ids=LABELS, multi_item=multi_item)
    result = scorer.score(query, items, label_token_ids=LABELS, multi_item=multi_item)
    assert result.error is None
    assert max_diff(result.scores, reference_scores(tiny_models.get(), query, items, LABELS)) <= 1e-5
    # pairs: 12 pairs, each with its query's head cached; packed: two pieces of 6 items, each repeating
    # the query and hitting, counted once as the job counts its query once
    assert result.cached_tokens == (1 if multi_item else 12) * (len(query) - 1)
    uncached = scorer_for(max_batch_tokens=160).score(
        query, items, label_token_ids=LABELS, multi_item=multi_item
    )
    assert result.prompt_tokens + result.cached_tokens == uncached.prompt_tokens
