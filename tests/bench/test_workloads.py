"""Workloads: the issue's shapes exactly, deterministic by seed, never a special-token id."""

from __future__ import annotations

import itertools

import pytest

from kafka_scorer_bench.models import FIRST_REGULAR_ID, SHAPES
from kafka_scorer_bench.workloads import WORKLOADS, build_workload, with_multi_item, workload_spec

ISSUE_SHAPES = {"rerank": (256, 32, 32), "many-items": (512, 200, 16), "short": (32, 1, 32)}


@pytest.mark.parametrize("name", sorted(ISSUE_SHAPES))
def test_full_size_shapes_are_the_issues(name: str) -> None:
    spec = workload_spec(name, device_type="cpu", num_jobs=2)
    workload = build_workload(spec, SHAPES["cpu-small"].vocab_size)
    q, n, i = ISSUE_SHAPES[name]
    assert len(workload.jobs) == 2
    for job in workload.jobs:
        assert len(job.query) == q and len(job.items) == n and all(len(item) == i for item in job.items)
    assert workload.pair_tokens == 2 * n * (q + i)
    assert workload.packed_tokens == 2 * (q + n * i)
    if name == "short":
        assert spec.model_kind == "classification" and workload.jobs[0].label_token_ids is None
    else:
        assert len(workload.jobs[0].label_token_ids) == 2


@pytest.mark.parametrize("name", WORKLOADS)
def test_same_seed_same_jobs_and_no_special_ids(name: str) -> None:
    spec = workload_spec(name, quick=True)
    one = build_workload(spec, 512, seed=3).jobs
    two = build_workload(spec, 512, seed=3).jobs
    other = build_workload(spec, 512, seed=4).jobs
    assert one == two and one != other
    for job in one:
        ids = list(job.query) + [t for item in job.items for t in item] + (job.label_token_ids or [])
        assert all(FIRST_REGULAR_ID <= t < 512 for t in ids)


def test_mixed_stream_mixes_shapes_labels_and_softmax_modes() -> None:
    jobs = build_workload(workload_spec("mixed", device_type="cpu", num_jobs=40), 32768).jobs
    assert len({len(j.items) for j in jobs}) > 2
    assert len({len(j.label_token_ids) for j in jobs}) > 1
    assert {j.apply_softmax for j in jobs} == {True, False}
    assert any(a.query == b.query for a, b in itertools.pairwise(jobs))  # a query's items over two jobs


def test_multi_item_flags() -> None:
    jobs = build_workload(workload_spec("mixed", quick=True), 512).jobs
    assert all(j.multi_item is False for j in with_multi_item(jobs, False))
    on = with_multi_item(jobs, True)
    assert all(j.multi_item is (True if len(j.items) >= 2 else None) for j in on)
    assert [j.items for j in on] == [j.items for j in jobs]
