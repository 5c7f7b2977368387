"""The engine contract: what the worker relies on of any engine behind its seam (worker/engine.py).

`EngineContract` is written once and run against the worker's fake engine and a real engine of every
model kind (tests/engine/test_engine_contract.py), the way tests/worker/test_delivery.py runs one
delivery contract for both modes. It speaks only through the seam's calls the worker makes (`prepare`,
`pack`, `run_packed`, `served`, `stats`): a kind that breaks a promise fails here, not in production.

A subclass supplies the engine (fixtures `engine`, and `deterministic_engine`, which skips a kind that
refuses the mode with its reason), a valid job of its kind (`labels`) and the fault seam (`breaking`):
every forward calls the fault with its token ids before it runs, so a fault can break the forwards that
hold one job's marker token, or every forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import pytest

from kafka_scorer.wire.engine_stats import EngineStats
from kafka_scorer.wire.protocol import ErrorCode, Job, Result
from kafka_scorer.worker.engine import Engine
from tests.worker.conftest import Fault

POISON = 97
"""A token id only the poison job holds (tiny vocabularies are at least 384 tokens)."""

POISONED_DEVICE = "CUDA error: an illegal memory access was encountered"
"""What CUDA says when the context is lost (engine/failures.py: fatal)."""

TOLERANCE = 1e-5
"""Batch-mates change a job's scores by rounding only (bitwise in deterministic mode)."""


class ForwardBroken(ValueError):
    """The fault a poison job causes: an error of the batch, not of the device."""


def run(engine: Engine[Any, Any], jobs: Sequence[Job]) -> list[Result]:
    """The worker's path: prepare each job, pack those that need the device, run them; the results in
    the jobs' order (refusals at prepare where they stand)."""
    prepared = [engine.prepare(job, _id(job)) for job in jobs]
    runnable = [p for p in prepared if not isinstance(p, Result)]
    ran = engine.run_packed(engine.pack(runnable)) if runnable else []
    assert [r.id for r in ran] == [p.job_id for p in runnable], "run_packed keeps the packed jobs' order"
    scored = iter(ran)
    return [p if isinstance(p, Result) else next(scored) for p in prepared]


def alone(engine: Engine[Any, Any], jobs: Sequence[Job]) -> dict[str, Result]:
    """Each job's result run on its own: what its result must be whatever its batch-mates."""
    return {_id(job): run(engine, [job])[0] for job in jobs}


def _id(job: Job) -> str:
    assert job.id is not None
    return job.id


def flat(result: Result) -> list[float]:
    assert result.error is None, result.error
    assert result.scores is not None
    return [x for row in result.scores for x in row]


def break_marked(tokens: Sequence[int]) -> None:
    """The fault of a forward that holds the poison job."""
    if POISON in tokens:
        raise ForwardBroken("this input breaks the model")


def poison_device(tokens: Sequence[int]) -> None:
    """The fault of a device that is gone: every forward."""
    raise RuntimeError(POISONED_DEVICE)


class EngineContract:
    """What every engine promises the worker; a subclass says which engine."""

    labels: ClassVar[dict[str, Any]] = {}
    """Fields a valid job of the kind needs (a CausalLM's label tokens)."""
    tolerance: ClassVar[float] = TOLERANCE
    """How far batch-mates may move a job's scores (rounding of the engine's dtype)."""

    @pytest.fixture
    def engine(self) -> Engine[Any, Any]:
        raise NotImplementedError

    @pytest.fixture
    def deterministic_engine(self) -> Engine[Any, Any]:
        raise NotImplementedError

    @pytest.fixture
    def cached_engine(self) -> Engine[Any, Any]:
        """The kind in its default configuration with its prefix cache on; a kind without one skips."""
        pytest.skip("this kind keeps no prefix cache")

    def breaking(self, engine: Engine[Any, Any], fault: Fault) -> AbstractContextManager[list[int]]:
        """While open, every forward of `engine` calls `fault(token ids)` first; yields the sizes (in
        tokens) of the forwards tried."""
        raise NotImplementedError

    def max_items(self, engine: Engine[Any, Any]) -> int:
        """The engine's `max_items_per_job`: one more item is refused."""
        raise NotImplementedError

    def job(self, job_id: str, seed: int = 0, **fields: Any) -> Job:
        """A valid token-id job; seeds give different lengths and tokens (never `POISON`)."""
        shape: dict[str, Any] = {
            "query": [3 + seed, 4, 5],
            "items": [[7 + seed], [8, 9 + seed], [10] * (1 + seed % 3)],
        }
        return Job(id=job_id, **{**shape, **self.labels, **fields})

    def mates(self, count: int = 5) -> list[Job]:
        return [self.job(f"mate-{i}", seed=i) for i in range(count)]

    def poisoned(self) -> Job:
        return self.job("poison", query=[POISON, 4, 5])

    def invalid(self, engine: Engine[Any, Any]) -> dict[str, tuple[Job, ErrorCode]]:
        """Jobs every engine refuses at prepare, and the code each is refused with."""
        too_many = 1 + self.max_items(engine)
        return {
            "other-model": (
                self.job("other-model", model="not-" + engine.served.name),
                ErrorCode.MODEL_MISMATCH,
            ),
            "too-many": (self.job("too-many", items=[[7]] * too_many), ErrorCode.TOO_LONG),
        }

    def test_an_invalid_job_is_an_error_result_and_its_mates_are_scored(self, engine) -> None:
        mates = self.mates(3)
        invalid = self.invalid(engine)
        clean = alone(engine, mates)
        jobs = [mates[0], invalid["other-model"][0], mates[1], invalid["too-many"][0], mates[2]]
        results = {r.id: r for r in run(engine, jobs)}
        for job_id, (_, code) in invalid.items():
            error = results.pop(job_id).error
            assert error is not None and error.code is code, error
        for job_id, result in results.items():
            assert flat(result) == pytest.approx(flat(clean[job_id]), abs=self.tolerance)

    def test_results_come_back_in_the_jobs_order_each_its_own(self, engine) -> None:
        jobs = self.mates(5)[::-1]  # longest first: a scheduler that sorts by length would reorder them
        clean = alone(engine, jobs)
        results = run(engine, jobs)
        assert [r.id for r in results] == [j.id for j in jobs]
        for result in results:
            assert flat(result) == pytest.approx(flat(clean[result.id]), abs=self.tolerance)

    def test_the_job_that_breaks_the_forward_is_answered_internal_alone(self, engine) -> None:
        mates = self.mates(5)
        clean = alone(engine, mates)
        jobs = [*mates[:2], self.poisoned(), *mates[2:]]
        with self.breaking(engine, break_marked) as forwards:
            results = run(engine, jobs)
        assert [r.id for r in results] == [j.id for j in jobs]
        by_id = {r.id: r for r in results}
        error = by_id.pop("poison").error
        assert error is not None and error.code is ErrorCode.INTERNAL, error
        assert "this input breaks the model" in error.message
        for job_id, result in by_id.items():
            assert flat(result) == pytest.approx(flat(clean[job_id]), abs=self.tolerance)
        assert len(forwards) > 1, "the failed batch must have been run again in parts"

    def test_a_poisoned_device_is_raised_and_never_tried_again(self, engine) -> None:
        with (
            self.breaking(engine, poison_device) as forwards,
            pytest.raises(RuntimeError, match="illegal memory"),
        ):
            run(engine, self.mates(4))
        assert len(forwards) == 1, "a poisoned device must not be tried again"

    def test_every_result_carries_the_served_provenance(self, engine) -> None:
        served = engine.served
        assert served.revision and served.dtype, "an engine says which checkpoint and dtype it serves"
        invalid = [job for job, _ in self.invalid(engine).values()]
        with self.breaking(engine, break_marked):
            results = run(engine, [*self.mates(2), self.poisoned(), *invalid])
        assert {r.error.code for r in results if r.error} >= {ErrorCode.INTERNAL, ErrorCode.MODEL_MISMATCH}
        for result in results:
            assert (result.model, result.model_revision, result.dtype) == (
                served.name,
                served.revision,
                served.dtype,
            ), result.id

    def test_stats_are_plain_counters(self, engine) -> None:
        """What /metrics reads of the engine comes through the seam typed (wire/engine_stats.py)."""
        stats = engine.stats()
        assert isinstance(stats, EngineStats)
        for part in (stats.prefix_cache, stats.embedding_cache, stats.cuda_graphs):
            assert part is None or all(isinstance(value, int) for value in part.values())

    def test_deterministic_scores_are_bitwise_the_same_alone_and_among_mates(
        self, deterministic_engine
    ) -> None:
        job = self.job("watched", seed=1)
        by_itself = flat(run(deterministic_engine, [job])[0])
        for mates in (self.mates(4), [self.job("long", seed=2, items=[[11] * 40] * 6)]):
            among = {r.id: r for r in run(deterministic_engine, [*mates, job])}
            assert flat(among["watched"]) == by_itself  # exact: no tolerance

    def test_the_same_job_again_is_bitwise_the_same_with_the_cache_on(self, cached_engine) -> None:
        """SGLang's identical-calls assertion in the default engine: the first call computes a head the
        cache keeps (on its second sighting), later calls hit it, and every call gives the same bits;
        a batch whose jobs bring new heads, run again, too."""
        job = self.job("again", seed=1, query=list(range(11, 51)))
        first = flat(run(cached_engine, [job])[0])
        for _ in range(3):
            assert flat(run(cached_engine, [job])[0]) == first  # exact: no tolerance
        mates = [self.job(f"mate-{i}", seed=i, query=list(range(60 + i, 90))) for i in range(3)]
        batch = [*mates, job, mates[0]]
        before = [flat(result) for result in run(cached_engine, batch)]
        assert [flat(result) for result in run(cached_engine, batch)] == before

    @pytest.mark.parametrize("shape", ["items", "documents"])
    def test_every_shape_is_scored_or_refused_with_a_typed_error(self, engine, shape: str) -> None:
        texts = ["a short one", "a rather longer document to score", "third"]
        if shape == "items":
            job = self.job("shaped", items=list(texts), query="which one", top_n=2)
        else:
            documents = [texts[0], {"text": texts[1]}, texts[2]]
            job = Job(
                id="shaped",
                query="which one",
                documents=documents,
                top_n=2,
                return_documents=True,
                **self.labels,
            )
        (result,) = run(engine, [job])
        if result.error is not None:
            assert result.error.code is not ErrorCode.INTERNAL, result.error
            return
        assert len(result.scores or []) == len(texts)
        ranked = result.ranking if shape == "items" else result.results
        assert ranked is not None and len(ranked) == 2
        if shape == "documents":
            assert result.results is not None
            scores = [r.relevance_score for r in result.results]
            assert scores == sorted(scores, reverse=True)
            assert [r.document for r in result.results] == [
                {"text": texts[r.index]} for r in result.results
            ], "return_documents echoes each document, a text as {'text': ...}"
