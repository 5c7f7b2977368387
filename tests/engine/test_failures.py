"""A forward that fails: one job that breaks it is answered `internal` alone (the batch is retried in
halves), its batch-mates are scored as if nothing happened; a device error that poisons the process is
raised, never turned into answers. Faults are injected into the model runner, the rest is the real
engine on a tiny checkpoint."""

from __future__ import annotations

import pytest

from kafka_scorer.engine.failures import FatalDeviceError, is_fatal, is_out_of_memory
from kafka_scorer.wire.protocol import ErrorCode, Job, Result

POISON = 97  # a token id only the poison job holds

MATES = [
    Job(id=f"mate-{i}", query=[3 + i, 4, 5], items=[[7 + i], [8, 9 + i]], label_token_ids=[5, 6])
    for i in range(7)
]
POISONED = Job(id="poison", query=[POISON, 4, 5], items=[[7], [8]], label_token_ids=[5, 6])


@pytest.fixture
def scorer(scorer_for):
    return scorer_for("qwen3", "causal")


def _inject(monkeypatch, scorer, fault) -> list[int]:
    """Make the model runner call `fault(batch)` first; returns the list of forward sizes seen."""
    forward = scorer.describe().runner.forward
    sizes: list[int] = []

    def failing(batch):
        sizes.append(int(batch.input_ids.numel()))
        fault(batch)
        return forward(batch)

    monkeypatch.setattr(scorer.describe().runner, "forward", failing)
    return sizes


def _flat(rows: list[list[float]] | None) -> list[float]:
    assert rows is not None
    return [x for row in rows for x in row]


def _run(scorer, jobs: list[Job]) -> list[Result]:
    prepared = [scorer.engine.prepare(job, job.id) for job in jobs]
    return scorer.engine.run_batch(prepared)


def test_the_job_that_breaks_the_forward_is_answered_internal_alone(scorer, monkeypatch) -> None:
    clean = {r.id: r for r in _run(scorer, MATES)}

    def fault(batch) -> None:
        if (batch.input_ids == POISON).any():
            raise ValueError("this input breaks the model")

    sizes = _inject(monkeypatch, scorer, fault)
    jobs = [*MATES[:3], POISONED, *MATES[3:]]
    results = _run(scorer, jobs)

    assert [r.id for r in results] == [j.id for j in jobs]
    by_id = {r.id: r for r in results}
    poison = by_id.pop("poison")
    assert poison.error is not None and poison.error.code is ErrorCode.INTERNAL
    assert "this input breaks the model" in poison.error.message
    for job_id, result in by_id.items():
        assert result.error is None, result.error
        assert _flat(result.scores) == pytest.approx(_flat(clean[job_id].scores), abs=1e-5)
    assert len(sizes) > 1, "the failed batch must have been retried in parts"


def test_a_device_error_that_poisons_the_process_is_raised_not_answered(scorer, monkeypatch) -> None:
    def fault(batch) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    sizes = _inject(monkeypatch, scorer, fault)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        _run(scorer, MATES)
    assert len(sizes) == 1, "a poisoned device must not be tried again"


def test_out_of_memory_is_retried_in_halves_until_the_batch_fits(scorer, monkeypatch) -> None:
    clean = {r.id: r for r in _run(scorer, MATES)}
    one_job = max(len(j.query) + sum(len(i) for i in j.items) for j in MATES)

    class OutOfMemoryError(RuntimeError):  # torch.cuda.OutOfMemoryError's name; no GPU here
        pass

    def fault(batch) -> None:
        if batch.input_ids.numel() > 2 * one_job:
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    _inject(monkeypatch, scorer, fault)
    results = _run(scorer, MATES)
    assert all(r.error is None for r in results)
    for result in results:
        assert _flat(result.scores) == pytest.approx(_flat(clean[result.id].scores), abs=1e-5)


def test_one_job_that_does_not_fit_after_freeing_memory_is_fatal(scorer, monkeypatch) -> None:
    def fault(batch) -> None:
        raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB")

    sizes = _inject(monkeypatch, scorer, fault)
    with pytest.raises(FatalDeviceError, match="max_batch_tokens"):
        _run(scorer, [MATES[0]])
    assert len(sizes) == 2  # the first try, then one more after freeing the cache


@pytest.mark.parametrize(
    ("message", "fatal"),
    [
        ("CUDA error: an illegal memory access was encountered", True),
        ("CUDA error: device-side assert triggered", True),
        ("CUDA error: unspecified launch failure", True),
        ("CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm`", True),
        ("CUDA out of memory. Tried to allocate 2.00 GiB", False),
        ("shape '[1, -1, 8, 64]' is invalid for input of size 100", False),
        ("index out of range in self", False),
    ],
)
def test_fatal_is_only_what_poisons_the_device(message: str, fatal: bool) -> None:
    assert is_fatal(RuntimeError(message)) is fatal


def test_out_of_memory_is_recognised_by_type_name_and_message() -> None:
    class OutOfMemoryError(RuntimeError):
        pass

    assert is_out_of_memory(OutOfMemoryError("x"))
    assert is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 1 GiB"))
    assert not is_out_of_memory(RuntimeError("index out of range"))
