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
from dataclasses import dataclass, fields

import msgspec
import torch

from kafka_scorer.engine.attention.registry import choose_attention_backend
from kafka_scorer.engine.config import EngineConfig, default_batch_tokens
from kafka_scorer.engine.failures import failed_results
from kafka_scorer.engine.graphs.forward_graphs import ForwardGraphs, GraphStats, graphs_for
from kafka_scorer.engine.load.description import describe
from kafka_scorer.engine.load.deterministic import keeps_prefix_cache, make_deterministic
from kafka_scorer.engine.load.loaded_model import LoadedModel, ModelKind, load_model
from kafka_scorer.engine.pack.batch import ForwardBatch, build_forward_batch
from kafka_scorer.engine.pack.prefix_batch import cached_tokens, prefix_planner
from kafka_scorer.engine.pack.prefix_cache import PrefixCacheStats
from kafka_scorer.engine.pack.scheduler import TokenBudgetScheduler, plan_forwards
from kafka_scorer.engine.pack.tensors import to_wire
from kafka_scorer.engine.prepare.chunking import ChunkedItem, aggregate
from kafka_scorer.engine.prepare.documents import items_argument
from kafka_scorer.engine.prepare.inputs import JobPreparer
from kafka_scorer.engine.prepare.prepared import InputLimits, PreparedJob
from kafka_scorer.engine.prepare.ranking import ranking, reranked
from kafka_scorer.engine.prepare.templates import load_template
from kafka_scorer.engine.run.bisection import Bisection
from kafka_scorer.engine.run.runner import BatchOutput, ModelRunner
from kafka_scorer.engine.vision.jobs import carries_content, content_refused
from kafka_scorer.errors import SettingError
from kafka_scorer.wire.engine_stats import EngineStats, counters
from kafka_scorer.wire.protocol import Chunking, Job, Result, TemplateRef, parse_chunking
from kafka_scorer.wire.provenance import ServedModel

log = logging.getLogger(__name__)

_DEFAULT_PAIR_LIMIT = 32768


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
    """The engine of one checkpoint. `Scorer(path)` serves the decoder and cross-encoder kinds; a
    checkpoint of any kind is opened by `open_scorer` (`engine/load/choice.py`), which picks the class."""

    reads_images = False
    """Whether jobs with content parts are prepared (the vision kind's), or answered `unsupported`."""

    @staticmethod
    def _load(model: str, **options) -> LoadedModel:
        """The kind's loader (`engine/load/loaded_model.py`); a subclass of another kind loads its own
        checkpoints."""
        return load_model(model, **options)

    def __init__(
        self,
        model: str,
        *,
        served_model_name: str | None = None,
        dtype: str = "auto",
        device: str = "auto",
        trust_remote_code: bool = False,
        attention_backend: str = "auto",
        decoder_forward: str = "auto",
        max_batch_tokens: int = 0,
        max_items_per_job: int = 1024,
        max_pair_tokens: int = 0,
        truncate: bool = False,
        max_labels_per_job: int = 256,
        template: str = "",
        model_revision: str = "",
        chunking: Chunking | str | None = None,
        max_chunks_per_job: int = 256,
        max_images_per_job: int = 32,
        max_image_bytes: int = 10 * 2**20,
        max_image_pixels: int = 7680 * 4320,
        prefix_cache_mb: int = -1,
        embedding_cache_mb: int = -1,
        deterministic: bool = False,
        cuda_graph_tokens: int = -1,
    ) -> None:
        """`embedding_cache_mb` is read by the late-interaction kind only (`engine/late_interaction/`),
        the image limits by the vision kind (`engine/vision/`); `cuda_graph_tokens` by decoders with the
        engine's own layers (`engine/graphs/`)."""
        self.loaded: LoadedModel = self._load(
            model,
            served_name=served_model_name,
            dtype=dtype,
            device=device,
            trust_remote_code=trust_remote_code,
            decoder_forward=decoder_forward,
        )
        model_limit = self.loaded.max_positions or _DEFAULT_PAIR_LIMIT
        limits = InputLimits(
            max_items_per_job=max_items_per_job,
            max_pair_tokens=min(max_pair_tokens, model_limit) if max_pair_tokens else model_limit,
            truncate=truncate,
            max_labels_per_job=max_labels_per_job,
            chunking=parse_chunking(chunking) if isinstance(chunking, str) else chunking,
            max_chunks_per_job=max_chunks_per_job,
        )
        self.max_batch_tokens = max_batch_tokens or default_batch_tokens(self.loaded.device.type)
        self._auto_backend = attention_backend == "auto"
        self.attention_backend = attention_backend
        if self._auto_backend and not deterministic:  # the mode picks its own (no flex probe for it)
            self.attention_backend = choose_attention_backend(self.loaded.device)
        self.template = load_template(template)
        if self.template is not None and self.loaded.encoder is not None:
            raise SettingError(
                "template",
                f"template={template!r} but {model!r} is an encoder cross-encoder, whose pairs are its "
                "tokenizer's own pair encoding: unset --template (KAFKA_SCORER_TEMPLATE) for this model",
            )
        if deterministic:  # engine/load/deterministic.py: fixed-shape blocks, the mode's attention
            self.attention_backend = make_deterministic(self.loaded, attention_backend)
            if not keeps_prefix_cache(self.attention_backend):
                prefix_cache_mb = 0
        self.deterministic = deterministic
        self.revision = model_revision or self.loaded.revision
        # what every result is stamped with: fixed at load (the description, which `served` adds for the
        # worker's start-up line, is not built again for each result)
        self._provenance = ServedModel(self.model_name, self.revision, self.dtype_name)
        self._prefixes = prefix_planner(self.loaded, prefix_cache_mb, self.revision)
        self._preparer = JobPreparer(self.loaded, limits, self.template)
        self._runner = ModelRunner(self.loaded, deterministic, self._graphs_for(cuda_graph_tokens))
        self._executor: ThreadPoolExecutor | None = None

    def _graphs_for(self, setting: int) -> ForwardGraphs | None:
        """The body's CUDA graphs (captured at warm-up); none in deterministic mode (tiled attention)."""
        if self.deterministic:
            return None
        loaded = self.loaded
        return graphs_for(loaded.body, loaded.device, setting, self.max_batch_tokens, loaded.sliding_window)

    @property
    def graphs(self) -> ForwardGraphs | None:
        return self._runner.graphs

    @property
    def runner(self) -> ModelRunner:
        """The device side of a forward (its CUDA graphs, its label kernels), for the warm-up."""
        return self._runner

    @property
    def graph_stats(self) -> GraphStats | None:
        """The CUDA graphs' counters (None when none are captured), for the worker's metrics."""
        graphs = self._runner.graphs
        return graphs.stats() if graphs is not None and graphs.ready else None

    @classmethod
    def from_config(cls, config: EngineConfig) -> Scorer:
        """The engine as configured (the worker builds `config` from its settings)."""
        options = {f.name: getattr(config, f.name) for f in fields(config) if f.name != "model"}
        return cls(config.model, **options)

    @property
    def model_name(self) -> str:
        return self.loaded.name

    @property
    def kind(self) -> ModelKind:
        return self.loaded.kind

    @property
    def description(self) -> dict[str, str]:
        """What is served and how, as plain strings: the worker's start-up line and info metric."""
        return describe(self)

    @property
    def prefix_cache_capacity_mb(self) -> float:
        return self._prefixes.cache.capacity_bytes / 2**20 if self._prefixes else 0.0

    @property
    def dtype_name(self) -> str:
        return str(self.loaded.dtype).removeprefix("torch.")

    @property
    def served(self) -> ServedModel:
        """What the worker needs to know of the model (and stamps results with): name, revision, dtype."""
        return ServedModel(self.model_name, self.revision, self.dtype_name, self.description)

    def stamp(self, result: Result, template: TemplateRef | None = None) -> Result:
        """Provenance on a result (SPEC §8): which checkpoint, dtype and template produced it."""
        return self._provenance.stamp(result, template)

    def warm_up(self) -> None:
        """Compile, autotune and check the backend at the served shapes before the worker is ready
        (`engine/load/warm_up.py`)."""
        from kafka_scorer.engine.load.warm_up import warm_up

        warm_up(self)

    @property
    def limits(self) -> InputLimits:
        return self._preparer.limits

    @property
    def auto_backend(self) -> bool:
        """Whether the attention backend was chosen by the engine (and may be changed by the warm-up)."""
        return self._auto_backend

    def forget_prefixes(self) -> None:
        """Empty the prefix cache (the warm-up's prefixes are no traffic's)."""
        if self._prefixes is not None:
            self._prefixes.cache.clear()

    def prepare(self, job: Job, job_id: str) -> PreparedJob | Result:
        """A `Result` comes back for a job that needs no forward pass: an error, or no items. A job with
        images is refused `unsupported` unless the kind reads them (`reads_images`, SPEC §11)."""
        if not self.reads_images and carries_content(job):
            return self.stamp(content_refused(job_id, self.model_name))
        prepared = self._preparer.prepare(job, job_id)
        if isinstance(prepared, Result):
            return self.stamp(prepared, self._preparer.template_for(job))
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
            forwards = self._build_forwards(plan_forwards(jobs, self.max_batch_tokens))
        except Exception as exc:  # the engine's one guard around packing: the batch is answered, not lost
            log.exception("packing failed for %d jobs", len(jobs))
            return PackedBatch(jobs, [], failure=f"packing failed: {type(exc).__name__}: {exc}")
        return PackedBatch(jobs, forwards)

    def _build_forwards(self, groups: list[list[tuple[int, PreparedJob]]]) -> list[tuple[list, ForwardBatch]]:
        """The planned forwards' tensors; through the prefix cache (`engine/pack/prefix_batch.py`) groups come
        back reordered, after forwards of no group that compute their new heads."""
        if self._prefixes is None:
            return [self._build_forward(group) for group in groups]
        loaded, backend = self.loaded, self.attention_backend
        return self._prefixes.build_all(
            groups,
            device=loaded.device,
            attention_backend=backend,
            sliding_window=loaded.sliding_window,
            pad_to=self._pad_to,
        )

    def _build_forward(self, group: list[tuple[int, PreparedJob]]) -> tuple[list, ForwardBatch]:
        """One planned forward's tensors."""
        batch = build_forward_batch(
            [piece for _, piece in group],
            device=self.loaded.device,
            attention_backend=self.attention_backend,
            sliding_window=self.loaded.sliding_window,
            encoder=self.loaded.encoder,
            pad_to=self._pad_to,
        )
        return group, batch

    @property
    def _pad_to(self):
        """The packing thread pads a forward to its CUDA graph's bucket once graphs are captured (the
        warm-up captures them over the flex backend only)."""
        graphs = self._runner.graphs
        return graphs.bucket_for if graphs is not None else None

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
        for group, batch in packed.forwards:
            self._run_forward(group, batch, rows, hidden)
            for index, piece in group:
                cached[index] = cached_tokens(cached[index], piece)
        return [
            self._result(job, job_rows, job_hidden, job_cached)
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

    def _run_forward(
        self,
        group: list[tuple[int, PreparedJob]],
        batch: ForwardBatch,
        rows: list[list[list[float]]],
        hidden: list[list[torch.Tensor]],
    ) -> None:
        """Run one forward over `group` and append each piece's rows to its job's lists."""
        output = self.run_forward(batch)
        if self._prefixes is not None:
            self._prefixes.commit(batch)
        scores = output.scores.tolist()
        hidden_offset = 0
        for (index, piece), (start, end) in zip(group, batch.job_rows):
            width = len(piece.label_ids) if self.kind is ModelKind.CAUSAL_LM else len(scores[0])
            rows[index].extend(row[:width] for row in scores[start:end])
            if piece.job.return_pooled_hidden_states:
                hidden[index].append(output.hidden[hidden_offset : hidden_offset + end - start])
                hidden_offset += end - start

    def run_forward(self, batch: ForwardBatch) -> BatchOutput:
        """One built forward on the device (the device thread's, or the warm-up's checks)."""
        return self._runner.forward(batch)

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats | None:
        """The prefix cache's counters (None when it is off), for the worker's metrics and the bench."""
        return self._prefixes.cache.stats() if self._prefixes is not None else None

    def stats(self) -> EngineStats:
        """The counters the worker's /metrics reads at each scrape (the seam's `Engine.stats`)."""
        return EngineStats(
            prefix_cache=counters(self.prefix_cache_stats), cuda_graphs=counters(self.graph_stats)
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
