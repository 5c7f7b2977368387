"""Several jobs in one forward pass: each gets exactly what it gets alone, nothing leaks between them."""

from __future__ import annotations

import pytest

from kafka_scorer.engine.pack.batch import build_forward_batch
from kafka_scorer.wire.protocol import Job, Result
from tests.engine.reference import reference_scores

JOBS = [
    Job(
        id="a",
        query="What is the capital of California?",
        items=["Sacramento", "Los Angeles", ""],
        label_token_ids=[5, 6],
    ),
    Job(
        id="b",
        query="What is the capital of California?",
        items=["San Diego", "no"],
        label_token_ids=[7, 8, 9],
        apply_softmax=True,
        return_pooled_hidden_states=True,
    ),
    Job(id="c", query="Is the review positive?", items=["great food"], label_token_ids=[10]),
    Job(
        id="d",
        query=[3, 4, 5, 6],
        items=[[7], [8, 9], [], [10, 11, 12]],
        label_token_ids=[1, 2, 3, 4, 5, 6],
        apply_softmax=True,
    ),
    Job(
        id="e",
        query="rivers and oceans",
        items=["mountains", "rivers"],
        label_token_ids=[11, 12],
        item_first=True,
    ),
    Job(
        id="f",
        query="What is the capital of California?",
        items=["Fresno", "Oakland"],
        label_token_ids=[5, 6],
        multi_item=False,
    ),
    Job(id="g", query="empty", items=[], label_token_ids=[1]),
]


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("backend", ["dense", "cascade", "flex"])
def test_each_job_in_a_mixed_batch_equals_the_job_alone(scorer_for, tiny_models, backend):
    scorer = scorer_for(attention_backend=backend)
    together = scorer.score_jobs(JOBS)
    assert [r.id for r in together] == [job.id for job in JOBS]
    for job, result in zip(JOBS, together):
        alone = scorer.score_jobs([job])[0]
        assert result.error is None and alone.error is None
        assert len(result.scores) == len(job.items)
        for got_row, alone_row in zip(result.scores, alone.scores):
            assert got_row == pytest.approx(alone_row, abs=1e-5)
        assert result.prompt_tokens == alone.prompt_tokens
        assert (result.pooled_hidden_states is not None) == job.return_pooled_hidden_states
        want = reference_scores(
            tiny_models.get(), job.query, job.items, job.label_token_ids, job.apply_softmax, job.item_first
        )
        for got_row, want_row in zip(result.scores, want):
            assert got_row == pytest.approx(want_row, abs=1e-4)


def test_mixed_batch_really_is_one_forward(scorer_for):
    """The jobs above fit one batch, and jobs a and b share one packed sequence (same query ids)."""
    scorer = scorer_for()
    prepared = [scorer.engine.prepare(job, job.id) for job in JOBS[:-1]]
    batch = build_forward_batch(prepared, device=scorer.describe().loaded.device)
    a, b = prepared[0], prepared[1]
    assert a.packed and b.packed and a.query == b.query
    # a+b share one sequence, c is single-item (1 pair), d packed, e item_first (2 pairs), f 2 pairs.
    assert len(batch.layout.seq_lens) == 1 + 1 + 1 + 2 + 2
    assert batch.layout.item_lens[0] == tuple(len(i) for i in a.items + b.items)
    assert batch.num_tokens == sum(batch.layout.seq_lens) < sum(job.num_tokens for job in prepared)


def test_a_job_larger_than_the_budget_is_split_across_forwards_without_changing_scores(
    tiny_models, monkeypatch
):
    from kafka_scorer.engine.scorer import Scorer

    job = Job(
        id="wide",
        query=JOBS[0].query,
        items=[f"item number {i}" for i in range(12)],
        label_token_ids=[5, 6],
        multi_item=False,
        return_pooled_hidden_states=True,
    )
    roomy = Scorer(str(tiny_models.get()), dtype="float32", device="cpu")
    tight = Scorer(str(tiny_models.get()), dtype="float32", device="cpu", max_batch_tokens=64)
    forwards = []
    original = tight.describe().runner.forward
    monkeypatch.setattr(
        tight.describe().runner, "forward", lambda batch: forwards.append(batch.num_tokens) or original(batch)
    )
    whole, split = roomy.score_jobs([job])[0], tight.score_jobs([job])[0]
    assert len(forwards) > 2 and max(forwards) <= 64 and sum(forwards) == split.prompt_tokens
    for split_row, whole_row in zip(split.scores, whole.scores, strict=True):
        assert split_row == pytest.approx(whole_row, abs=1e-6)
    assert split.pooled_hidden_states.shape == [12, 64]
    want = reference_scores(tiny_models.get(), job.query, job.items, [5, 6])
    for got_row, want_row in zip(split.scores, want):
        assert got_row == pytest.approx(want_row, abs=1e-5)


@pytest.mark.parametrize("backend", ["dense", "cascade"])
def test_a_packed_job_larger_than_the_budget_becomes_several_packed_sequences(
    tiny_models, monkeypatch, backend
):
    """Each piece repeats the query, so every item still sees exactly the query and itself."""
    from kafka_scorer.engine.scorer import Scorer

    job = Job(
        id="many",
        query=JOBS[0].query,
        items=[f"passage {i} about rivers" for i in range(16)],
        label_token_ids=[5, 6, 7],
        multi_item=True,
        return_pooled_hidden_states=True,
    )
    tight = Scorer(  # without the prefix cache, which would compute the query once and cut the pieces
        str(tiny_models.get()),
        dtype="float32",
        device="cpu",
        max_batch_tokens=48,
        attention_backend=backend,
        prefix_cache_mb=0,
    )
    forwards = []
    original = tight.describe().runner.forward

    def record(batch):
        forwards.append((batch.num_tokens, batch.layout.prefix_lens, batch.layout.item_lens))
        return original(batch)

    monkeypatch.setattr(tight.describe().runner, "forward", record)
    (result,) = tight.score_jobs([job])
    assert result.error is None and len(result.scores) == 16
    assert len(forwards) > 1 and all(tokens <= 48 for tokens, _, _ in forwards)
    query_len = forwards[0][1][0]
    assert all(prefixes == [query_len] for _, prefixes, _ in forwards), "one packed sequence per forward"
    assert all(len(items) > 1 for _, _, (items,) in forwards[:-1])
    assert sum(len(items) for _, _, (items,) in forwards) == 16
    assert result.pooled_hidden_states.shape == [16, 64]
    want = reference_scores(tiny_models.get(), job.query, job.items, [5, 6, 7])
    for got_row, want_row in zip(result.scores, want, strict=True):
        assert got_row == pytest.approx(want_row, abs=1e-5)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("backend", ["cascade", "flex"])
def test_packing_builds_the_attention_metadata_and_the_runner_moves_it_once_per_forward(
    scorer_for, monkeypatch, backend
):
    """The metadata exists on each ForwardBatch before any forward (built on the packing thread), the
    runner moves it to the device once per forward, and every layer of that forward reads the moved
    copy."""
    import dataclasses
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from kafka_scorer.engine.attention import registry
    from kafka_scorer.engine.attention.cascade import CascadeMetadata
    from kafka_scorer.engine.attention.flex import FlexMetadata

    metadata_type = {"cascade": CascadeMetadata, "flex": FlexMetadata}[backend]
    entry = registry.BACKENDS[backend]
    built_on: list[str] = []
    moved: list[object] = []
    read: list[object] = []

    def prepare(layout, pin):
        built_on.append(threading.current_thread().name)
        return entry.prepare(layout, pin)

    def attend(q, k, v, metadata, *args):
        read.append(metadata)
        return entry.attend(q, k, v, metadata, *args)

    def to(self, device):
        moved.append(self)
        return original_to(self, device)

    original_to = metadata_type.to
    monkeypatch.setattr(metadata_type, "to", to)
    monkeypatch.setitem(
        registry.BACKENDS, backend, dataclasses.replace(entry, prepare=prepare, attend=attend)
    )
    scorer = scorer_for(attention_backend=backend, max_batch_tokens=64)
    prepared = [scorer.engine.prepare(job, str(i)) for i, job in enumerate(JOBS)]
    prepared = [job for job in prepared if not isinstance(job, Result)]
    with ThreadPoolExecutor(1, thread_name_prefix="packer") as packer:
        packed = packer.submit(scorer.engine.pack, prepared).result()
    host = [built.forward.attention for built in packed.forwards]
    assert len(host) > 1 and all(isinstance(metadata, metadata_type) for metadata in host)
    assert built_on == ["packer_0"] * len(host) and not moved and not read

    results = scorer.engine.run_packed(packed)
    assert all(result.error is None for result in results)
    assert [id(m) for m in moved] == [id(m) for m in host], "each forward's metadata moved exactly once"
    layers = scorer.describe().loaded.model.config.num_hidden_layers
    assert len(read) == layers * len(host) and len({id(m) for m in read}) == len(host)
    assert not any(m is h for m in read for h in host), "layers read the moved copy, not the host one"
