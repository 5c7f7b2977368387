"""The engine the worker drives: prepare -> pack -> run_packed (`worker/engine.py`'s `Engine` seam).

`prepare` (CPU, any thread) validates and tokenizes; `pack` (CPU, any thread) cuts a batch into
budget-sized forwards and builds each ForwardBatch; `run_packed` (the one thread that owns the device)
runs the forwards and splits the scores back into one `Result` per job; `run_batch` is both in one
call. None of them raises for a bad job: errors are values, so one poison job never takes a batch, a
partition or the worker down.

Start-up is a stage of its own (`engine/load/start_up.py`): `warm_up` hands it narrow capabilities and
keeps the attention backend it returns; nothing below this module writes this class's attributes
(tests/test_layout.py). What tests and the bench read of the parts is one snapshot, `describe()`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from kafka_scorer.engine.config import EngineConfig
from kafka_scorer.engine.engine_view import EngineView
from kafka_scorer.engine.failures import failed_results
from kafka_scorer.engine.graphs.forward_graphs import GraphStats
from kafka_scorer.engine.kinds.choice import KINDS, open_kind
from kafka_scorer.engine.kinds.kind import Built, Kind, KindClass
from kafka_scorer.engine.load.description import Settled, describe
from kafka_scorer.engine.load.start_up import StartUp
from kafka_scorer.engine.pack.scheduler import plan_forwards
from kafka_scorer.engine.pack.tensors import to_wire
from kafka_scorer.engine.prepare.chunking import ChunkedItem, aggregate
from kafka_scorer.engine.prepare.content import carries_content, content_refused
from kafka_scorer.engine.prepare.prepared import InputError, PreparedJob
from kafka_scorer.engine.prepare.ranking import ranking, reranked
from kafka_scorer.engine.run.bisection import Bisection
from kafka_scorer.engine.run.in_batches import score_in_batches
from kafka_scorer.engine.run.variants import Variant
from kafka_scorer.wire.engine_stats import EngineStats, counters
from kafka_scorer.wire.protocol import Job, Result, TemplateRef, error_result
from kafka_scorer.wire.provenance import ServedModel

log = logging.getLogger(__name__)


@dataclass
class PackedBatch:
    """A batch ready for the device: its forwards, or why packing failed (answered per job)."""

    jobs: list[PreparedJob]
    forwards: list[Built]
    backend: str
    """The attention backend the forwards were built with: a failed batch's halves are packed with it."""
    failure: str | None = None

    def runnable(self) -> list[PreparedJob]:
        """The jobs to run. A packing failure is raised here, on the device thread, so that the
        bisection (engine/run/bisection.py) packs the batch again in halves and isolates the job behind it."""
        if self.failure is not None and self.jobs:
            raise RuntimeError(self.failure)
        return self.jobs


class ScoringEngine:
    """The engine of one checkpoint, of any kind. The kind (`engine/kinds/`) is chosen from the
    checkpoint in one place (`engine/kinds/choice.py`) and held here; what the seam promises is this
    class's, for every kind."""

    def __init__(self, config: EngineConfig, kinds: Sequence[KindClass] = KINDS) -> None:
        """`kinds`: the kinds the checkpoint may be (`engine/kinds/choice.py`); a test adds its own."""
        self._kind: Kind = open_kind(config, kinds)
        served = self._kind.served
        self._backend = served.attention_backend
        """Read by every forward built; `warm_up` keeps what the start-up stage chose."""
        # what every result is stamped with: fixed at load (the description, which `served` adds for the
        # worker's start-up line, is not built again for each result)
        self._provenance = ServedModel(served.loaded.name, served.revision, served.dtype_name)

    @property
    def served(self) -> ServedModel:
        """What the worker needs to know of the model (and stamps results with): name, revision, dtype,
        and the start-up line's fields."""
        provenance = self._provenance
        return ServedModel(provenance.name, provenance.revision, provenance.dtype, self._description())

    @property
    def max_batch_tokens(self) -> int:
        """The token budget of one forward: the worker's batches are closed at it."""
        return self._kind.served.max_batch_tokens

    def warm_up(self) -> None:
        """Compile, autotune and check the backend at the served shapes before the worker is ready
        (`engine/load/warm_up.py`, or the kind's own); keeps the backend it settled on."""
        self._backend = self._kind.warm_up(self._start_up(), self._backend)

    def describe(self) -> EngineView:
        """The engine's parts and counters now, for tests, the bench and the demo."""
        kind, caches = self._kind, self._kind.cache_stats()
        return EngineView(
            model_name=kind.served.loaded.name,
            loaded=kind.served.loaded,
            kind=kind,
            runner=kind.runner,
            graphs=kind.runner.graphs,
            attention_backend=self._backend,
            fields=self._description(),
            prefix_cache=caches.prefix,
            embedding_cache=caches.embedding,
            cuda_graphs=self._graph_stats(),
        )

    def stats(self) -> EngineStats:
        """The counters the worker's /metrics reads at each scrape (the seam's `Engine.stats`)."""
        caches = self._kind.cache_stats()
        return EngineStats(
            prefix_cache=counters(caches.prefix),
            cuda_graphs=counters(self._graph_stats()),
            embedding_cache=counters(caches.embedding),
        )

    @contextmanager
    def running(self, variant: Variant) -> Iterator[None]:
        """Batches run inside as `variant` says (another backend, other layers): the bench's contenders
        side by side on one engine; the served backend and body again after."""
        served = self._backend
        self._backend = variant.backend or served
        try:
            with variant.body_in(self._kind.served.loaded):
                yield
        finally:
            self._backend = served

    def prepare(self, job: Job, job_id: str) -> PreparedJob | Result:
        """A `Result` comes back for a job that needs no forward pass: an error, or no items. A job with
        images is refused `unsupported` unless the kind reads them (`reads_images`, SPEC §11)."""
        name = self._provenance.name
        if not self._kind.reads_images and carries_content(job):
            return self._stamp(content_refused(job_id, name))
        preparer = self._kind.preparer
        try:
            prepared = preparer.prepare(job, job_id)
        except InputError as exc:  # every kind's bad input, answered the same way
            prepared = error_result(job_id, exc.code, str(exc), model=name, item=exc.item)
        if isinstance(prepared, Result):
            return self._stamp(prepared, preparer.template_for(job))
        return prepared

    def run_batch(self, jobs: Sequence[PreparedJob]) -> list[Result]:
        """One forward pass per token budget's worth (usually one); results in the jobs' order."""
        return self.run_packed(self.pack(jobs))

    def pack(self, jobs: Sequence[PreparedJob]) -> PackedBatch:
        """CPU work of a batch (any thread): cut it into budget-sized forwards and build their inputs.

        The worker calls this on its own thread while the device runs the previous batch, so the device
        thread goes straight from one forward to the next. Never raises: a failure is kept and answered
        by `run_packed`.
        """
        return self._pack(jobs, self._backend)

    def run_packed(self, packed: PackedBatch) -> list[Result]:
        """On the device thread: the forwards of one packed batch; results in the jobs' order.

        A batch that fails is run again in halves until the job that breaks it stands alone; that job
        alone is answered `internal` and its batch-mates are scored. An error that poisons the device
        is raised instead (engine/run/bisection.py, engine/failures.py): the worker must stop.
        """

        def pack(jobs: Sequence[PreparedJob]) -> PackedBatch:
            return self._pack(jobs, packed.backend)

        bisection = Bisection(pack, self._run_packed_once, self._free_memory, self._answer_failed)
        return bisection.run(packed.jobs, packed)

    def _pack(self, jobs: Sequence[PreparedJob], backend: str) -> PackedBatch:
        jobs = list(jobs)
        try:
            groups = plan_forwards(jobs, self.max_batch_tokens)
            forwards = self._kind.build(groups, backend)
        except Exception as exc:  # the engine's one guard around packing: the batch is answered, not lost
            log.exception("packing failed for %d jobs", len(jobs))
            return PackedBatch(jobs, [], backend, failure=f"packing failed: {type(exc).__name__}: {exc}")
        return PackedBatch(jobs, forwards, backend)

    def _start_up(self) -> StartUp:
        """What the start-up stage may use of this engine: its parts to look at, three calls."""
        kind = self._kind

        def score_jobs(jobs: Sequence[Job], backend: str) -> list[Result]:
            def run_batch(batch: list[PreparedJob]) -> list[Result]:
                return self.run_packed(self._pack(batch, backend))

            return score_in_batches(jobs, self.prepare, run_batch, self.max_batch_tokens)

        return StartUp(
            loaded=kind.served.loaded,
            runner=kind.runner,
            graphs=kind.runner.graphs,
            limits=kind.preparer.limits,
            max_batch_tokens=self.max_batch_tokens,
            auto_backend=kind.served.auto_backend,
            score_jobs=score_jobs,
            prepare=self.prepare,
            forget=kind.forget,
        )

    def _description(self) -> dict[str, str]:
        """What is served and how, as plain strings: the worker's start-up line and info metric."""
        served, prefixes = self._kind.served, self._kind.cache_stats().prefix
        settled = Settled(
            dtype=served.dtype_name,
            deterministic=served.config.deterministic,
            revision=served.revision,
            template=served.template.name if served.template else "",
            prefix_cache_mb=prefixes.capacity_bytes / 2**20 if prefixes else 0.0,
        )
        return self._kind.describe(describe(self._start_up(), self._backend, settled), self._backend)

    def _graph_stats(self) -> GraphStats | None:
        """The CUDA graphs' counters; None where none are captured (the caches' are the kind's)."""
        graphs = self._kind.runner.graphs
        return graphs.stats() if graphs is not None and graphs.ready else None

    def _stamp(self, result: Result, template: TemplateRef | None = None) -> Result:
        """Provenance on a result (SPEC §8): which checkpoint, dtype and template produced it."""
        return self._provenance.stamp(result, template)

    def _free_memory(self) -> None:
        release_device_memory(self._kind.served.loaded.device)

    def _answer_failed(self, job: PreparedJob, exc: Exception) -> list[Result]:
        name = self._provenance.name
        return [self._stamp(r, job.template) for r in failed_results([job.job_id], exc, name)]

    def _run_packed_once(self, packed: PackedBatch) -> list[Result]:
        """The forwards of one packed batch; raises on the first failure."""
        jobs = packed.runnable()
        rows: list[list[list[float]]] = [[] for _ in jobs]
        hidden: list[list[torch.Tensor]] = [[] for _ in jobs]
        cached = [0] * len(jobs)
        for built in packed.forwards:
            for piece in built.run():
                rows[piece.index].extend(piece.rows)
                if piece.hidden is not None:
                    hidden[piece.index].append(piece.hidden)
                cached[piece.index] = piece.add_cached(cached[piece.index])
        return [
            self._result(job, self._kind.finish(job, job_rows), job_hidden, job_cached)
            for job, job_rows, job_hidden, job_cached in zip(jobs, rows, hidden, cached)
        ]

    def _result(
        self, job: PreparedJob, rows: list[list[float]], hidden: list[torch.Tensor], cached: int = 0
    ) -> Result:
        """One job's result from its scoring rows, one per window of a chunked job (SPEC §9)."""
        pooled = torch.cat(hidden) if hidden else None
        chunks: list[ChunkedItem] = []
        if job.chunks is not None:
            rows, pooled, chunks = aggregate(job.chunks, rows, job.rank_by, pooled, job.rank_normalised)
        return self._stamp(
            Result(
                id=job.job_id,
                scores=rows,
                prompt_tokens=job.num_tokens - cached,
                cached_tokens=cached,
                model=self._provenance.name,
                pooled_hidden_states=to_wire(pooled) if pooled is not None else None,
                warnings=job.warnings,
                truncated_items=job.truncated_items,
                ranking=ranking(job.job, rows, job.rank_by, job.rank_normalised),
                results=reranked(job, rows),
                chunks=chunks,
            ),
            job.template,
        )


def release_device_memory(device: torch.device) -> None:
    """Give cached blocks back after an out-of-memory error, so a smaller retry can fit."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
