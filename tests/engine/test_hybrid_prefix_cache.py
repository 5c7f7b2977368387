"""The prefix cache of a hybrid model's states (issue 38 item 3): Qwen3.5 and Qwen3-Next.

A cached head of such a model is each Gated DeltaNet layer's convolution window and recurrent state at
the head's end, plus the full-attention layers' keys and values (`engine/pack/prefix_cache.py`,
`engine/recurrent/runs.py`). With the cache warm, every job of a mixed batch (MIS, pairs, a query past
one 64-token delta-rule chunk, templated queries sharing the template's head) must still equal plain
transformers run one pair at a time, a job sent again must get the same bits, and no job's state may
reach another's (the leak test: batch orders and item orders that put other heads' sequences next to
it change nothing).
"""

from __future__ import annotations

import pytest

from kafka_scorer.engine.pack.prefix_batch import prefix_planner
from kafka_scorer.wire.protocol import Job
from tests.engine.test_hybrid_models import LONG_QUERY, _assert_equals_reference, _needs_family, _reversed

MODELS = [("qwen3_5", "causal"), ("qwen3_5", "classification"), ("qwen3_next", "causal")]
CALLS = 3
"""Cold (heads computed, seen once), second sighting (kept), then served from the cache."""


def _cached(scorer_for, arch: str, kind: str):
    _needs_family(arch)
    return scorer_for(arch, kind, num_labels=3, decoder_forward="transformers", prefix_cache_mb=8)


def _template(tmp_path_factory) -> str:
    file = tmp_path_factory.mktemp("hybrid-template") / "judge.txt"
    file.write_text(
        "judge the answer by the rubric, rule after rule; " * 4 + "{instruction}\nQ: {query}\nA: {item}"
    )
    return str(file)


def _jobs(causal: bool) -> list[Job]:
    labels = {"label_token_ids": [5, 6, 7]} if causal else {}
    return [
        Job(id="mis", query=LONG_QUERY, items=[[7], list(range(10, 40)), [], [8, 9]], **labels),
        Job(id="pairs", query=LONG_QUERY[:40], items=[[11, 12], [13]], multi_item=False, **labels),
        Job(id="again", query=LONG_QUERY, items=[[21, 22, 23]], **labels),
        Job(id="short", query=[4, 5], items=[[6], [7, 8]], **labels),  # a head shorter than the window
    ]


@pytest.mark.parametrize(("arch", "kind"), MODELS)
def test_with_the_state_cache_warm_every_job_equals_its_pairs_alone(scorer_for, tiny_models, arch, kind):
    scorer = _cached(scorer_for, arch, kind)
    path = tiny_models.get(arch, kind, 3)
    jobs = _jobs(kind == "causal")
    runs = [scorer.score_jobs(jobs) for _ in range(CALLS)]
    for job, *results in zip(jobs, *runs):
        assert all(result.error is None for result in results), results
        assert all(result.scores == results[0].scores for result in results), job.id  # bit for bit
        _assert_equals_reference(path, job, results[0].scores)
    served = [sum(result.cached_tokens for result in run) for run in runs]
    assert served[-1] > served[0]  # the last call was served from the cache
    stats = scorer.describe().prefix_cache
    assert stats is not None and stats.entries > 0 and stats.bytes <= stats.capacity_bytes


@pytest.mark.parametrize(("arch", "kind"), MODELS[:2])
def test_no_state_leaks_between_jobs_sharing_a_template_head(
    scorer_for, tiny_models, tmp_path_factory, arch, kind
):
    """Templated queries share the template's head: one state, many cut queries started from it. In any
    batch order, with their items reversed, each job equals its own pairs alone: a state handed to the
    wrong sequence, or carried from one run into the next, would move some score."""
    from kafka_scorer.engine.scorer import Scorer

    _needs_family(arch)
    path = tiny_models.get(arch, kind, 3)
    scorer = Scorer(
        str(path),
        dtype="float32",
        device="cpu",
        decoder_forward="transformers",
        template=_template(tmp_path_factory),
    )
    labels = {"label_token_ids": [5, 6, 7]} if kind == "causal" else {}
    questions = ["what is rain?", "why is the sky blue at noon?", "is ice water?"]
    jobs = [
        Job(id=q, query=q, items=["water falling", "light scattering in air", ""], multi_item=m, **labels)
        for q, m in zip(questions, [None, False, None])
    ]
    for batch in (jobs, jobs[::-1], [_reversed(job) for job in jobs], jobs[1:]):
        for job, result in zip(batch, scorer.score_jobs(batch)):
            assert result.error is None, result.error
            prepared = scorer.engine.prepare(job, "p")
            _assert_equals_reference(
                path, Job(query=prepared.query, items=prepared.items, **labels), result.scores
            )
    assert scorer.describe().prefix_cache.hits > 0 and scorer.describe().prefix_cache.entries >= 2


def test_an_entry_is_the_state_at_the_heads_end(scorer_for):
    """What the cache keeps of a hybrid: keys and values of the full-attention layers only, and each
    Gated DeltaNet layer's recurrent state and convolution window."""
    scorer = _cached(scorer_for, "qwen3_5", "causal")
    loaded = scorer.describe().loaded
    planner = prefix_planner(loaded, 8, loaded.revision)
    assert planner is not None and loaded.recurrent is not None
    shape = planner.shape
    assert shape.recurrent == loaded.recurrent.layers > 0 and len(shape.stateless) == shape.recurrent
    scorer.describe().kind.forget()
    for _ in range(2):
        scorer.score(LONG_QUERY, [[7]], label_token_ids=[5, 6, 7])
    entries = list(scorer.describe().kind.prefixes.cache._store.values())
    assert entries and all(entry.complete for entry in entries)
    for entry in entries:
        assert all(entry.keys[n] is None for n in shape.stateless)
        assert all(state is not None for state in entry.states)
        assert all(window.shape[0] == loaded.recurrent.window for window in entry.windows)


def test_deterministic_mode_refuses_them_with_one_line(tiny_models):
    """Issue 38 item 4: a hybrid's scores follow their batch-mates in the last bits (its recurrence runs
    in padded groups shaped by the batch, through transformers' layers), so the mode that promises
    bit-identical scores whatever the batch refuses it at start-up, naming the setting."""
    from kafka_scorer.engine.scorer import Scorer
    from kafka_scorer.errors import SettingError

    _needs_family("qwen3_5")
    path = tiny_models.get("qwen3_5", "classification", 3)
    with pytest.raises(SettingError, match=r"hybrid linear-attention model.*unset --deterministic"):
        Scorer(str(path), dtype="float32", device="cpu", deterministic=True)


def test_runs_start_a_cut_sequence_from_its_heads_state_and_hand_a_computed_head_its_own():
    """A stream of a head computed now (5 tokens, for entry 1), a cut pair after entry 0 (3 tokens)
    and a cut MIS query after entry 1 (1 token) with items of 2 and 1: the cut pair and the cut query
    start from their heads' states (table rows 0 and 1), their windows the heads' last inputs past the
    zero row (index 12: entry 0's at 13-15, entry 1's at 16-18); the items' windows reach back into
    their head's, the query being shorter than the window; the head hands its last 3 tokens on."""
    from kafka_scorer.engine.attention.layout import AttentionLayout
    from kafka_scorer.engine.recurrent.runs import RunPrefixes, build_runs

    layout = AttentionLayout([0, 5, 8], [5, 3, 4], [5, 3, 1], [(), (), (2, 1)])
    prefixes = RunPrefixes((object(), object()), starts={5: 0, 8: 1}, stores={0: 1})  # type: ignore[arg-type]
    runs = build_runs(layout, window=3, prefixes=prefixes)
    assert runs.tokens == 12 and runs.sources == (0, 1)
    rows = {
        group.index[row, 0].item(): (group, row)
        for group in runs.groups
        for row in range(group.index.shape[0])
    }
    head, _ = rows[0]
    assert head.source_from is None and head.state_from is None
    assert head.store_entries == (1,) and head.store_window[0].tolist() == [2, 3, 4]
    pair, pair_row = rows[5]
    assert pair.source_from[pair_row].item() == 0 and pair.window[pair_row].tolist() == [13, 14, 15]
    query, query_row = rows[8]
    assert query.source_from[query_row].item() == 1 and query.window[query_row].tolist() == [16, 17, 18]
    for start in (9, 11):
        item, row = rows[start]
        assert item.state_from is not None and item.window[row].tolist() == [17, 18, 8]
