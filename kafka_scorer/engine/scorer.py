"""The in-process API: the seam between the Kafka worker and the model.

`prepare` (CPU, any thread) validates and tokenizes; `pack` (CPU, any thread) cuts a batch into
budget-sized forwards and builds each ForwardBatch; `run_packed` (the one thread that owns the device)
runs the forwards and splits the scores back into one `Result` per job; `run_batch` is both in one
call. None of them raises for a bad job: errors are values, so one poison job never takes a batch, a
partition or the worker down.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import msgspec
import torch

from kafka_scorer.engine.config import EngineConfig
from kafka_scorer.engine.failures import failed_results
from kafka_scorer.engine.graphs.forward_graphs import ForwardGraphs, GraphStats
from kafka_scorer.engine.kinds.choice import open_kind
from kafka_scorer.engine.kinds.kind import Kind
from kafka_scorer.engine.late_interaction.embedding_cache import EmbeddingCacheStats
from kafka_scorer.engine.load.description import describe
from kafka_scorer.engine.models.loaded import LoadedModel, ModelKind
from kafka_scorer.engine.pack.batch import ForwardBatch
from kafka_scorer.engine.pack.prefix_cache import PrefixCacheStats
from kafka_scorer.engine.pack.scheduler import TokenBudgetScheduler, plan_forwards
from kafka_scorer.engine.pack.tensors import to_wire
from kafka_scorer.engine.prepare.chunking import ChunkedItem, aggregate
from kafka_scorer.engine.prepare.documents import items_argument
from kafka_scorer.engine.prepare.prepared import InputError, InputLimits, PreparedJob
from kafka_scorer.engine.prepare.ranking import ranking, reranked
from kafka_scorer.engine.run.bisection import Bisection
from kafka_scorer.engine.run.runner import BatchOutput, ModelRunner
from kafka_scorer.engine.vision.jobs import carries_content, content_refused
from kafka_scorer.wire.engine_stats import EngineStats, counters
from kafka_scorer.wire.protocol import Chunking, Job, Result, TemplateRef, error_result
from kafka_scorer.wire.provenance import ServedModel

log = logging.getLogger(__name__)


@dataclass
class PackedBatch:
    """A batch ready for the device: its forwards, or why packing failed (answered per job)."""

    jobs: list[PreparedJob]
    forwards: list[tuple[list[tuple[int, PreparedJob]], ForwardBatch]]
    failure: str | None = None

    def runnable(self) -> list[PreparedJob]:
        """The jobs to run. A packing failure is raised here, on the device thread, so that the
        bisection (engine/run/bisection.py) packs the batch again in halves and isolates the job behind it."""
        if self.failure is not None and self.jobs:
            raise RuntimeError(self.failure)
        return self.jobs


class Scorer:
    """The engine of one checkpoint, of any kind: `Scorer(path, **settings)` or
    `Scorer.from_config(config)`. The kind (`engine/kinds/`) is chosen from the checkpoint in one place
    (`engine/kinds/choice.py`) and held here; what the seam promises is this class's, for every kind."""

    def __init__(self, model: str | EngineConfig, **settings: Any) -> None:
        """`settings` are `EngineConfig`'s fields (docs/configuration.md), when `model` is a path."""
        config = model if isinstance(model, EngineConfig) else EngineConfig(model=model, **settings)
        self.strategy: Kind = open_kind(config)
        served = self.strategy.served
        self.loaded: LoadedModel = served.loaded
        self.template = served.template
        self.max_batch_tokens = served.max_batch_tokens
        self.attention_backend = served.attention_backend
        """Read by every forward built; the warm-up's fallbacks may change it."""
        self.auto_backend = served.auto_backend
        """Whether the engine chose the backend (and the warm-up may change it)."""
        self.deterministic = config.deterministic
        self.revision = served.revision
        # what every result is stamped with: fixed at load (the description, which `served` adds for the
        # worker's start-up line, is not built again for each result)
        self._provenance = ServedModel(self.model_name, self.revision, self.dtype_name)
        self._executor: ThreadPoolExecutor | None = None

    @classmethod
    def from_config(cls, config: EngineConfig) -> Scorer:
        """The engine as configured (the worker builds `config` from its settings)."""
        return cls(config)

    @property
    def reads_images(self) -> bool:
        """Whether jobs with content parts are prepared (the vision kind's), or answered `unsupported`."""
        return self.strategy.reads_images

    @property
    def graphs(self) -> ForwardGraphs | None:
        return self.strategy.graphs

    @property
    def runner(self) -> ModelRunner:
        """The device side of a forward (its CUDA graphs, its label kernels), for the warm-up."""
        return self.strategy.runner

    @property
    def graph_stats(self) -> GraphStats | None:
        """The CUDA graphs' counters (None when none are captured), for the worker's metrics."""
        graphs = self.graphs
        return graphs.stats() if graphs is not None and graphs.ready else None

    @property
    def model_name(self) -> str:
        return self.loaded.name

    @property
    def kind(self) -> ModelKind:
        return self.loaded.kind

    @property
    def description(self) -> dict[str, str]:
        """What is served and how, as plain strings: the worker's start-up line and info metric."""
        return self.strategy.describe(describe(self), self.attention_backend)

    @property
    def prefix_cache_capacity_mb(self) -> float:
        prefixes = self.strategy.prefixes
        return prefixes.cache.capacity_bytes / 2**20 if prefixes else 0.0

    @property
    def dtype_name(self) -> str:
        return self.strategy.served.dtype_name

    @property
    def served(self) -> ServedModel:
        """What the worker needs to know of the model (and stamps results with): name, revision, dtype."""
        return ServedModel(self.model_name, self.revision, self.dtype_name, self.description)

    def stamp(self, result: Result, template: TemplateRef | None = None) -> Result:
        """Provenance on a result (SPEC §8): which checkpoint, dtype and template produced it."""
        return self._provenance.stamp(result, template)

    def warm_up(self) -> None:
        """Compile, autotune and check the backend at the served shapes before the worker is ready
        (`engine/load/warm_up.py`, or the kind's own)."""
        self.strategy.warm_up(self)

    @property
    def limits(self) -> InputLimits:
        return self.strategy.preparer.limits

    def forget_prefixes(self) -> None:
        """Empty the prefix cache (the warm-up's prefixes are no traffic's)."""
        if self.strategy.prefixes is not None:
            self.strategy.prefixes.cache.clear()

    def clear_embedding_cache(self) -> None:
        """Empty the kind's embedding cache (document vectors, image features), where it has one."""
        if self.strategy.embeddings is not None:
            self.strategy.embeddings.clear()

    def prepare(self, job: Job, job_id: str) -> PreparedJob | Result:
        """A `Result` comes back for a job that needs no forward pass: an error, or no items. A job with
        images is refused `unsupported` unless the kind reads them (`reads_images`, SPEC §11)."""
        if not self.reads_images and carries_content(job):
            return self.stamp(content_refused(job_id, self.model_name))
        preparer = self.strategy.preparer
        try:
            prepared = preparer.prepare(job, job_id)
        except InputError as exc:  # every kind's bad input, answered the same way
            prepared = error_result(job_id, exc.code, str(exc), model=self.model_name, item=exc.item)
        if isinstance(prepared, Result):
            return self.stamp(prepared, preparer.template_for(job))
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
        jobs = list(jobs)
        try:
            groups = plan_forwards(jobs, self.max_batch_tokens)
            forwards = self.strategy.forwards(groups, self.attention_backend)
        except Exception as exc:  # the engine's one guard around packing: the batch is answered, not lost
            log.exception("packing failed for %d jobs", len(jobs))
            return PackedBatch(jobs, [], failure=f"packing failed: {type(exc).__name__}: {exc}")
        return PackedBatch(jobs, forwards)

    def run_packed(self, packed: PackedBatch) -> list[Result]:
        """On the device thread: the forwards of one packed batch; results in the jobs' order.

        A batch that fails is run again in halves until the job that breaks it stands alone; that job
        alone is answered `internal` and its batch-mates are scored. An error that poisons the device
        is raised instead (engine/run/bisection.py, engine/failures.py): the worker must stop.
        """
        bisection = Bisection(self.pack, self._run_packed_once, self._free_memory, self._answer_failed)
        return bisection.run(packed.jobs, packed)

    def _free_memory(self) -> None:
        release_device_memory(self.loaded.device)

    def _answer_failed(self, job: PreparedJob, exc: Exception) -> list[Result]:
        return [self.stamp(r, job.template) for r in failed_results([job.job_id], exc, self.model_name)]

    def _run_packed_once(self, packed: PackedBatch) -> list[Result]:
        """The forwards of one packed batch; raises on the first failure."""
        jobs = packed.runnable()
        rows: list[list[list[float]]] = [[] for _ in jobs]
        hidden: list[list[torch.Tensor]] = [[] for _ in jobs]
        cached = [0] * len(jobs)
        for group, forward in packed.forwards:
            for piece in self.strategy.run(group, forward):
                rows[piece.index].extend(piece.rows)
                if piece.hidden is not None:
                    hidden[piece.index].append(piece.hidden)
                cached[piece.index] = piece.add_cached(cached[piece.index])
        return [
            self._result(job, self.strategy.finish(job, job_rows), job_hidden, job_cached)
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
        return self.stamp(
            Result(
                id=job.job_id,
                scores=rows,
                prompt_tokens=job.num_tokens - cached,
                cached_tokens=cached,
                model=self.model_name,
                pooled_hidden_states=to_wire(pooled) if pooled is not None else None,
                warnings=job.warnings,
                truncated_items=job.truncated_items,
                ranking=ranking(job.job, rows, job.rank_by, job.rank_normalised),
                results=reranked(job, rows),
                chunks=chunks,
            ),
            job.template,
        )

    def run_forward(self, batch: ForwardBatch) -> BatchOutput:
        """One built forward of a text kind on the device (the warm-up's checks)."""
        return self.runner.forward(batch)

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats | None:
        """The prefix cache's counters (None when it is off), for the worker's metrics and the bench."""
        prefixes = self.strategy.prefixes
        return prefixes.cache.stats() if prefixes is not None else None

    @property
    def embedding_cache_stats(self) -> EmbeddingCacheStats | None:
        """The kind's embedding cache's counters (None when it has none or it is off)."""
        embeddings = self.strategy.embeddings
        return embeddings.stats() if embeddings is not None else None

    def stats(self) -> EngineStats:
        """The counters the worker's /metrics reads at each scrape (the seam's `Engine.stats`)."""
        return EngineStats(
            prefix_cache=counters(self.prefix_cache_stats),
            cuda_graphs=counters(self.graph_stats),
            embedding_cache=counters(self.embedding_cache_stats),
        )

    def score_jobs(self, jobs: Sequence[Job]) -> list[Result]:
        """Prepare, batch by the token budget and run; results in the jobs' order."""
        results: list[Result | None] = [None] * len(jobs)
        scheduler: TokenBudgetScheduler[PreparedJob] = TokenBudgetScheduler(self.max_batch_tokens)
        position: dict[int, int] = {}
        for index, job in enumerate(jobs):
            prepared = self.prepare(job, job.id if job.id is not None else str(index))
            if isinstance(prepared, Result):
                results[index] = prepared
            else:
                position[id(prepared)] = index
                scheduler.add(prepared)
        while batch := scheduler.next_batch():
            for prepared, result in zip(batch, self.run_batch(batch)):
                results[position[id(prepared)]] = result
        return [result for result in results if result is not None]

    def score(
        self,
        query: str | list[int],
        items: str | Sequence[str] | Sequence[list[int]],
        *,
        label_token_ids: list[int] | None = None,
        apply_softmax: bool = False,
        item_first: bool = False,
        return_pooled_hidden_states: bool = False,
        multi_item: bool | None = None,
        **fields: object,
    ) -> Result:
        """Score `items` against `query`. A single string as `items` is one item (SGLang accepts the
        same), not a sequence of one-character items. `fields` are the other Job fields (SPEC §8:
        `label_tokens`, `instruction`, `top_n`, `rank_by`, `activation`, `truncate`; SPEC §9: `chunking`)."""
        if isinstance(fields.get("chunking"), dict):  # the wire's object, as a caller writes it
            fields["chunking"] = msgspec.convert(fields["chunking"], Chunking)
        job = Job(
            query=query,
            items=items_argument(items),
            label_token_ids=label_token_ids,
            apply_softmax=apply_softmax,
            item_first=item_first,
            return_pooled_hidden_states=return_pooled_hidden_states,
            multi_item=multi_item,
            **fields,  # type: ignore[arg-type]  # the caller's keyword fields are Job's own, checked by msgspec at construction
        )
        return self.score_jobs([job])[0]

    def score_content(self, query: object, items: list, **fields: object) -> Result:
        """`score` for queries and items with content parts (SPEC §11), as a caller writes them: base64
        or data URIs for images (`wire/content.py`). Kinds that read no images answer `unsupported`."""
        from kafka_scorer.wire.content import dec_hook

        job = msgspec.convert({"query": query, "items": items, **fields}, Job, dec_hook=dec_hook)
        return self.score_jobs([job])[0]

    async def score_async(
        self, query: str | list[int], items: str | Sequence[str] | Sequence[list[int]], **kwargs
    ) -> Result:
        """Runs on the scorer's single device thread so the event loop keeps serving."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kafka-scorer-device")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: self.score(query, items, **kwargs))

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None


def release_device_memory(device: torch.device) -> None:
    """Give cached blocks back after an out-of-memory error, so a smaller retry can fit."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def open_scorer(model: str, **settings: Any) -> Scorer:
    """`Scorer(model, **settings)`, under the name callers used when each kind had a class of its own."""
    return Scorer(model, **settings)
