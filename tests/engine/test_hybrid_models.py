"""Hybrid linear-attention models (Qwen3.5, Qwen3-Next): batched scores equal each pair run alone.

Their Gated DeltaNet layers carry a convolution window and a recurrent state along the sequence; packed
into one stream they leaked one job's tokens into the next job's scores (issue 38). Every job of a mixed
batch, in either order, with MIS on and off, must equal plain transformers run one (query, item) pair
at a time (tests/engine/reference.py). The long token-id query passes one 64-token chunk of the delta
rule, so the state an MIS item starts from is a multi-chunk one.
"""

from __future__ import annotations

import msgspec
import pytest
import torch

from kafka_scorer.engine.attention.layout import AttentionLayout
from kafka_scorer.engine.config import EngineConfig
from kafka_scorer.engine.kinds.choice import open_kind
from kafka_scorer.engine.models.loaded import ModelLoadError
from kafka_scorer.engine.recurrent.detection import PASSES_LAYER_KWARGS
from kafka_scorer.engine.recurrent.runs import build_runs
from kafka_scorer.wire.protocol import Job
from tests.engine.reference import reference_scores

MODELS = [
    ("qwen3_5", "causal"),
    ("qwen3_5", "classification"),
    ("qwen3_5_moe", "causal"),  # transformers has no Qwen3.5-MoE classifier class
    ("qwen3_next", "causal"),  # Qwen3-Next is MoE: 4 experts here
    ("qwen3_next", "classification"),
]

LONG_QUERY = list(range(3, 73))


def _needs_family(arch: str) -> None:
    """Qwen3.5 came to transformers after 5.1, the declared floor (`./dev floors` runs these tests), and
    hybrids are served from 5.9 on (`recurrent/detection.py`; below it, refused: see the test below)."""
    import transformers
    from packaging.version import Version

    config = {"qwen3_5": "Qwen3_5TextConfig", "qwen3_5_moe": "Qwen3_5MoeTextConfig"}.get(arch)
    if config is not None and not hasattr(transformers, config):
        pytest.skip(f"transformers {transformers.__version__} has no {config}")
    if Version(transformers.__version__) < Version(PASSES_LAYER_KWARGS):
        pytest.skip(f"hybrids are refused at load below transformers {PASSES_LAYER_KWARGS}")


def test_below_the_transformers_that_passes_layer_arguments_a_hybrid_is_refused(tiny_models, monkeypatch):
    """Never packed with shared state: a clear load error names the version to install."""
    from kafka_scorer.engine.recurrent import detection

    monkeypatch.setattr(detection, "PASSES_LAYER_KWARGS", "99.0")  # the installed one is older than that
    with pytest.raises(ModelLoadError, match=r"needs transformers >= 99\.0"):
        open_kind(
            EngineConfig(model=str(tiny_models.get("qwen3_next", "causal", 3)), dtype="float32", device="cpu")
        )


def _scorer(scorer_for, arch: str, kind: str):
    """The hybrids run transformers' layers (with their GDN layers wrapped) whatever `decoder_forward`
    says; naming it keeps the suite's deterministic run (KAFKA_SCORER_TEST_DETERMINISTIC=1), which
    needs the fused layers, from turning these into start-up refusals."""
    _needs_family(arch)
    return scorer_for(arch, kind, num_labels=3, decoder_forward="transformers")


def _jobs(causal: bool, multi_item: bool | None) -> list[Job]:
    labels = {"label_token_ids": [5, 6, 7]} if causal else {}
    capital = "What is the capital of California?"
    return [
        Job(
            id="a",
            query=capital,
            items=["Sacramento", "Los Angeles is a big city in the south", "", "San Diego"],
            multi_item=multi_item,
            **labels,
        ),
        Job(
            id="b",
            query=capital,
            items=["Fresno", "Oakland"],
            apply_softmax=True,
            multi_item=multi_item,
            **labels,
        ),
        Job(id="c", query="rivers and oceans", items=["mountains"], multi_item=multi_item, **labels),
        Job(
            id="d",
            query=LONG_QUERY,
            items=[[7], list(range(10, 90)), [8, 9, 10]],
            multi_item=multi_item,
            **labels,
        ),
        Job(id="e", query="rivers and oceans", items=["mountains", "rivers"], item_first=True, **labels),
    ]


def _reversed(job: Job) -> Job:
    return msgspec.structs.replace(job, items=list(reversed(job.items)))


def _assert_equals_reference(path, job: Job, scores: list[list[float]]) -> None:
    want = reference_scores(
        path, job.query, job.items, job.label_token_ids, job.apply_softmax, job.item_first
    )
    assert len(scores) == len(want)
    for index, (got_row, want_row) in enumerate(zip(scores, want)):
        scale = max(abs(x) for x in want_row)
        error = max(abs(g - w) for g, w in zip(got_row, want_row))
        assert error <= 1e-4 * scale, f"job {job.id} item {index}: {got_row} vs {want_row}"


@pytest.mark.parametrize("multi_item", [None, True, False])
@pytest.mark.parametrize(("arch", "kind"), MODELS)
def test_every_job_of_a_mixed_batch_equals_its_pairs_alone(scorer_for, tiny_models, arch, kind, multi_item):
    scorer = _scorer(scorer_for, arch, kind)
    path = tiny_models.get(arch, kind, 3)
    jobs = _jobs(kind == "causal", multi_item)
    packed = [scorer.engine.prepare(job, job.id).packed for job in jobs]
    assert packed == [
        multi_item is not False,
        multi_item is not False,
        multi_item is True,
        multi_item is not False,
        False,
    ]
    for batch in (jobs, [_reversed(job) for job in reversed(jobs)]):
        results = scorer.score_jobs(batch)
        for job, result in zip(batch, results):
            assert result.error is None, result.error
            _assert_equals_reference(path, job, result.scores)


def test_a_job_alone_and_behind_another_scores_the_same(scorer_for):
    """The issue's symptom: job B's scores moved when job A ran before it in the same stream."""
    scorer = _scorer(scorer_for, "qwen3_5", "classification")
    first, second = _jobs(False, None)[0], _jobs(False, None)[2]
    alone = scorer.score_jobs([second])[0].scores
    behind = scorer.score_jobs([first, second])[1].scores
    assert torch.tensor(behind) == pytest.approx(torch.tensor(alone), rel=1e-5, abs=1e-6)


def test_runs_start_each_sequence_from_zero_and_each_item_from_its_query():
    """A pair of 5 tokens; a query of 2 with items of 3, 0 and 1 tokens; an empty query with an item of
    2: the pair, the query and the empty query's item lead from zero state; the query's two non-empty
    items start from its state, their convolution window its 2 tokens after one zero row (index 13)."""
    layout = AttentionLayout([0, 5, 11], [5, 6, 2], [5, 2, 0], [(), (3, 0, 1), (2,)])
    runs = build_runs(layout, window=3)
    assert runs.tokens == 13 and runs.kept_states == 1
    leading = [group for group in runs.groups if group.state_from is None]
    items = [group for group in runs.groups if group.state_from is not None]
    assert runs.groups == leading + items  # an item's group needs its query's state

    def tokens(groups):
        return sorted(token for group in groups for token in group.tokens.tolist())

    assert tokens(leading) == [0, 1, 2, 3, 4, 5, 6, 11, 12]
    assert tokens(items) == [7, 8, 9, 10]
    starts = sorted(
        (group.index[row, 0].item(), group.state_from[row].item(), group.window[row].tolist())
        for group in items
        for row in range(group.index.shape[0])
    )
    assert starts == [(7, 0, [13, 5, 6]), (10, 0, [13, 5, 6])]
    assert all(set(group.window.flatten().tolist()) <= {13} for group in leading)
    kept = [
        (group.index[row, 0].item(), slot)
        for group in leading
        if group.keep_rows is not None
        for row, slot in zip(group.keep_rows.tolist(), group.keep_slots.tolist())
    ]
    assert kept == [(5, 0)]  # only the query with items keeps its state


def _save(directory, config):
    from kafka_scorer.checkpoints.tiny_models import build_tokenizer, save_random_model

    directory.mkdir()
    tokenizer = build_tokenizer(directory)
    config.vocab_size = len(tokenizer)
    return save_random_model(config, "causal", directory)


@pytest.mark.parametrize("family", ["lfm2", "mamba"])
def test_other_stateful_families_are_refused_at_load(tmp_path, family):
    """Short convolutions (LFM2) and selective scans (Mamba) would be packed across sequences: refused."""
    import transformers

    if family == "lfm2":
        config = transformers.Lfm2Config(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            layer_types=["conv", "full_attention"],
            architectures=["Lfm2ForCausalLM"],
        )
    else:
        config = transformers.MambaConfig(
            hidden_size=64, state_size=8, num_hidden_layers=2, architectures=["MambaForCausalLM"]
        )
    path = _save(tmp_path / family, config)
    with pytest.raises(ModelLoadError, match="carry state along the sequence"):
        open_kind(EngineConfig(model=str(path), dtype="float32", device="cpu"))
