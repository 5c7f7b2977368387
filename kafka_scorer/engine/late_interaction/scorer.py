"""The `Scorer` of a late-interaction (ColBERT) checkpoint.

`open_scorer(path)` (`engine/load/choice.py`) builds this class when `path` is a ColBERT directory, so the
worker, the CLI and the bench serve it like any other kind; its checkpoint is loaded by `loading.py`
(the `_load` hook), not by `engine/load/loaded_model.py`. Preparing, the device-thread failure handling and
result stamping are `Scorer`'s; what differs is the preparer (`preparer.py`), the forward
(`forward.py`: queries and uncached documents in one pass, MaxSim per job) and the embedding cache.
Results carry one column, the MaxSim score of each item, and `cached_tokens` counts the document
tokens whose vectors came from the cache. Equal documents of one job get the first one's score
(`same_rows_for_equal_documents`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import cast

from kafka_scorer.engine.late_interaction.embedding_cache import (
    EmbeddingCache,
    EmbeddingCacheStats,
    embedding_capacity_bytes,
)
from kafka_scorer.engine.late_interaction.forward import LateForward, build_late_forward, run_late_forward
from kafka_scorer.engine.late_interaction.loading import load_late_interaction
from kafka_scorer.engine.late_interaction.preparer import LateJob, LatePreparer
from kafka_scorer.engine.load.loaded_model import LoadedModel
from kafka_scorer.engine.prepare.prepared import PreparedJob
from kafka_scorer.engine.scorer import PackedBatch, Scorer
from kafka_scorer.errors import SettingError
from kafka_scorer.wire.engine_stats import EngineStats, counters
from kafka_scorer.wire.protocol import Result


class LateInteractionScorer(Scorer):
    @staticmethod
    def _load(model: str, *, decoder_forward: str = "auto", **options) -> LoadedModel:
        """A ColBERT directory's encoder, projection and markers (`loading.py`); `decoder_forward`
        chooses a decoder's layers, and an encoder has none to choose."""
        return load_late_interaction(model, **options)

    def __init__(self, model: str, *, embedding_cache_mb: int = -1, **options) -> None:
        if options.get("template"):
            raise SettingError(
                "template",
                f"template={options['template']!r} but {model!r} is a late-interaction (ColBERT) model, "
                "which encodes as it defines: unset --template (KAFKA_SCORER_TEMPLATE) for it",
            )
        super().__init__(model, **options)
        self._preparer = LatePreparer(self.loaded, self._preparer.limits)  # type: ignore[assignment]  # LatePreparer stands in for JobPreparer (issue 40 item 2: one kind, one object)
        capacity = embedding_capacity_bytes(embedding_cache_mb)
        self._embeddings = (
            EmbeddingCache(capacity, (self.revision, self.dtype_name)) if capacity > 0 else None
        )

    @property
    def description(self) -> dict[str, str]:
        cache = self._embeddings
        mb = f"{cache.capacity_bytes / 2**20:g}" if cache is not None else "0"
        # its forwards use the pair groups (`forward.py`), or deterministic mode's tiles, whatever backend
        # was configured
        backend = self.attention_backend if self.deterministic else "cascade"
        return {**super().description, "attention_backend": backend, "embedding_cache_mb": mb}

    @property
    def embedding_cache_stats(self) -> EmbeddingCacheStats | None:
        return self._embeddings.stats() if self._embeddings is not None else None

    def stats(self) -> EngineStats:
        return replace(super().stats(), embedding_cache=counters(self.embedding_cache_stats))

    def clear_embedding_cache(self) -> None:
        if self._embeddings is not None:
            self._embeddings.clear()

    def warm_up(self) -> None:
        super().warm_up()
        self.clear_embedding_cache()  # the warm-up's documents are no traffic's

    def _build_forward(self, group: list[tuple[int, PreparedJob]]) -> tuple[list, LateForward]:  # type: ignore[override]  # the hook returns its kind's forward (issue 40 item 2: one kind, one object)
        """Scorer.pack's plan and guard; a forward here is the documents' and queries' late forward."""
        backend = self.attention_backend if self.deterministic else None
        late = cast("list[tuple[int, LateJob]]", group)  # this scorer's preparer is a LatePreparer
        return group, build_late_forward(late, self.loaded, self._embeddings, backend)

    def _run_packed_once(self, packed: PackedBatch) -> list[Result]:
        jobs = packed.runnable()
        rows: list[list[list[float]]] = [[] for _ in jobs]
        cached = [0] * len(jobs)
        for _, forward in packed.forwards:
            assert isinstance(forward, LateForward)
            scores = run_late_forward(forward, self.loaded, self._embeddings)
            for (index, _), piece_scores, piece_cached in zip(forward.group, scores, forward.cached_tokens):
                rows[index].extend([score] for score in piece_scores)
                cached[index] += piece_cached
        return [
            self._result(job, same_rows_for_equal_documents(job, job_rows), [], hit)
            for job, job_rows, hit in zip(jobs, rows, cached)
        ]


def same_rows_for_equal_documents(job: PreparedJob, rows: list[list[float]]) -> list[list[float]]:
    """Each document (or window) whose tokens equal an earlier one's takes that one's row.

    A job larger than the token budget is cut into pieces run in different forwards, and a forward's
    sequences are computed beside different batch-mates (their length buckets, the row count of every
    projection), so two copies of a document in different pieces came back a few ulps apart and ranked
    by that noise, not by index. Their inputs are the same tokens: the first copy's score is theirs.
    Within one forward a recurring document already runs once (`forward.py`)."""
    assert isinstance(job, LateJob)
    first: dict[bytes, int] = {}
    return [list(rows[first.setdefault(key, index)]) for index, key in enumerate(job.doc_keys)]
