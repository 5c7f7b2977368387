"""CUDA graphs for the MIS forward (`engine/graphs/`): replayed forwards score as plain transformers does.

Reference: plain transformers, one pair at a time (tests/engine/reference.py), never the engine run
another way. The `cpu` variant runs the same padding, static buffers and warm-up check in CI, without a
capture (off CUDA the body runs on the static buffers); the `cuda` one captures and replays.
"""

from __future__ import annotations

import logging
import math
import random

import msgspec
import pytest

from kafka_scorer.wire.protocol import Job
from tests.cuda_tests.devices import DEVICES, on_cuda
from tests.engine.reference import reference_scores

LABELS = [3, 44]


def log_diff(got: list[list[float]], want: list[list[float]]) -> float:
    """Largest difference of log-probabilities (the label probabilities are ~1e-3 here)."""
    return max(abs(math.log(a) - math.log(b)) for ra, rb in zip(got, want) for a, b in zip(ra, rb))


def graphed_scorer(path: str, device: str, **options):
    from kafka_scorer.engine.scorer import Scorer

    options = {"max_batch_tokens": 2048, "cuda_graph_tokens": 1024, "prefix_cache_mb": 0, **options}
    scorer = Scorer(path, dtype="float32", device=device, attention_backend="flex", **options)
    scorer.engine.warm_up()
    return scorer


def random_job(rng: random.Random, name: str, query: list[int] | None = None, longest: int = 60) -> Job:
    items = [
        [rng.randrange(5, 380) for _ in range(rng.randint(1, longest))] for _ in range(rng.randint(1, 8))
    ]
    query = query or [rng.randrange(5, 380) for _ in range(rng.randint(3, 90))]
    return Job(id=name, query=query, items=items, label_token_ids=LABELS)


@pytest.mark.parametrize("device", DEVICES)
def test_replayed_forwards_score_as_transformers_across_buckets_and_cache_hits(tiny_models, device):
    """Rounds of one to twelve jobs land in every bucket, one after another with other contents (a
    stale buffer or block index would show), a forward past the largest bucket runs uncaptured, and
    repeated queries go through the prefix cache (no graph for those forwards): all equal the reference.
    With the cache on, a job with a cacheable head (every job here but the item-first ones) computes its
    head alone and runs as a hit, uncaptured, so that a repeat gives the same bits (docs/engine.md,
    identical calls): only forwards of jobs without one replay."""
    path = tiny_models.get()
    scorer = graphed_scorer(str(path), device, prefix_cache_mb=16)
    graphs = scorer.describe().graphs
    assert graphs is not None and graphs.ready and graphs.buckets.sizes == (128, 256, 512, 1024)
    assert graphs.capture is on_cuda(device)
    assert scorer.describe().fields["cuda_graphs"].startswith("128..1024")
    rng = random.Random(11)
    shared = [rng.randrange(5, 380) for _ in range(70)]
    replays_before, tolerance = graphs.replays, 1e-3 if on_cuda(device) else 1e-4
    for round_ in range(6):
        count = [1, 3, 12, 2, 1, 5][round_]
        jobs = [random_job(rng, f"{round_}-{n}", shared if n % 4 == 3 else None) for n in range(count)]
        if round_ in (0, 4):  # no cacheable head (item first): a plain forward, replayed
            jobs = [msgspec.structs.replace(job, item_first=True) for job in jobs]
        if round_ == 2:  # one job alone past the largest bucket: an uncaptured forward
            jobs.append(random_job(rng, "long", longest=200))
        for job, result in zip(jobs, scorer.score_jobs(jobs)):
            assert result.error is None, result.error
            want = reference_scores(path, job.query, job.items, LABELS, item_first=bool(job.item_first))
            assert log_diff(result.scores, want) <= tolerance, job.id
    stats = scorer.describe().prefix_cache
    assert stats is not None and stats.hits > 0  # some forwards had cached prefixes: not replayed
    assert graphs.replays - replays_before == 2  # the rounds without a cacheable head


@pytest.mark.parametrize("device", DEVICES)
def test_a_sequence_longer_than_a_window_runs_uncaptured(tmp_path, device):
    """Gemma 2 with a 160-token window: a pair longer than the window takes the dense path in the
    windowed layers, which no graph recorded, so it runs from Python; short pairs replay. Both equal the
    reference (which applies the window)."""
    from kafka_scorer.checkpoints.tiny_models import build_tiny_model

    path = build_tiny_model(tmp_path / "gemma2", "gemma2", overrides={"sliding_window": 160})
    scorer = graphed_scorer(str(path), device)
    graphs = scorer.describe().graphs
    assert graphs is not None and graphs.ready and graphs.window == 160
    rng = random.Random(5)
    for longest, replayed in ((40, True), (240, False)):
        before = graphs.replays
        job = Job(
            id=str(longest),
            query=[rng.randrange(5, 380) for _ in range(30)],
            items=[[rng.randrange(5, 380) for _ in range(longest)]],
            label_token_ids=LABELS,
            multi_item=False,
        )
        (result,) = scorer.score_jobs([job])
        assert log_diff(result.scores, reference_scores(path, job.query, job.items, LABELS)) <= 1e-3
        assert (graphs.replays > before) is replayed


def test_a_graph_that_scores_differently_is_dropped_at_warm_up(tiny_models, monkeypatch, caplog):
    """The warm-up compares a replayed forward with the same forward run from Python: buffers that
    lose the positions (a broken copy) are caught, the graphs dropped with one line, and the forwards
    still score as the reference, unpadded."""
    from kafka_scorer.engine.graphs.static import StaticInputs

    load = StaticInputs.load

    def broken(self, batch):
        loaded = load(self, batch)
        self.positions.zero_()
        return loaded

    monkeypatch.setattr(StaticInputs, "load", broken)
    path = tiny_models.get()
    with caplog.at_level(logging.WARNING, logger="kafka_scorer.engine.load.warm_up"):
        scorer = graphed_scorer(str(path), "cpu")
    assert [r.message for r in caplog.records if "CUDA graphs off" in r.message] != []
    assert scorer.describe().graphs is not None and not scorer.describe().graphs.ready
    assert scorer.describe().fields["cuda_graphs"] == "off"
    job, before = random_job(random.Random(2), "after"), scorer.describe().graphs.replays
    (result,) = scorer.score_jobs([job])
    assert log_diff(result.scores, reference_scores(path, job.query, job.items, LABELS)) <= 1e-4
    assert scorer.describe().graphs.replays == before


def test_a_capture_that_fails_leaves_the_forward_uncaptured(tiny_models, monkeypatch, caplog):
    from kafka_scorer.engine.graphs.forward_graphs import ForwardGraphs

    def fails(self, inputs, pool):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(ForwardGraphs, "_capture", fails)
    with caplog.at_level(logging.WARNING, logger="kafka_scorer.engine.graphs.forward_graphs"):
        scorer = graphed_scorer(str(tiny_models.get()), "cpu")
    lines = [r.message for r in caplog.records if "CUDA graphs off" in r.message]
    assert len(lines) == 1 and "stream is capturing" in lines[0]
    assert scorer.describe().graphs is not None and scorer.describe().graphs.bucket_for(100) is None


def test_a_replay_that_fails_costs_no_job(tiny_models, monkeypatch, caplog):
    """A graph that fails in service is dropped with one line; the forward runs from Python and scores
    as the reference, and so do the next ones (unpadded)."""
    from kafka_scorer.engine.graphs.static import StaticInputs

    path = tiny_models.get()
    scorer = graphed_scorer(str(path), "cpu")
    assert scorer.describe().graphs is not None and scorer.describe().graphs.ready

    def fails(self, batch):
        raise RuntimeError("CUDA error: operation failed due to a previous error during capture")

    monkeypatch.setattr(StaticInputs, "load", fails)
    rng = random.Random(8)
    with caplog.at_level(logging.WARNING, logger="kafka_scorer.engine.graphs.forward_graphs"):
        for name in ("first", "second"):
            job = random_job(rng, name)
            (result,) = scorer.score_jobs([job])
            assert result.error is None
            assert log_diff(result.scores, reference_scores(path, job.query, job.items, LABELS)) <= 1e-4
    assert len([r for r in caplog.records if "a replay failed" in r.message]) == 1
    assert not scorer.describe().graphs.ready and scorer.describe().cuda_graphs is None
