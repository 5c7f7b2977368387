"""The `Scorer` of a vision-language (Qwen3-VL) CausalLM reranker.

`open_scorer(path)` (`engine/load/choice.py`) builds this class when `path` is a Qwen3-VL checkpoint, so
the worker, the CLI and the bench serve it like any other kind. Loading (`checkpoint.py`), preparing
(`preparer.py`: prompts, image checks and preprocessing) and the forward (`forward.py`) are this
package's; job validation of the label fields, result stamping, ranking, the rerank shape and the
device-thread failure handling (a failing batch bisected to the job behind it) are `Scorer`'s.
Image features are cached across jobs (`features.py`, sized by `embedding_cache_mb`). Not yet for
this kind, refused at start with the setting to change: deterministic mode. The prefix cache and
CUDA graphs are off for it (the decoder is transformers' own, with a 4-D mask).
"""

from __future__ import annotations

from dataclasses import replace
from typing import cast

import torch

from kafka_scorer.engine.late_interaction.embedding_cache import (
    EmbeddingCache,
    EmbeddingCacheStats,
    embedding_capacity_bytes,
)
from kafka_scorer.engine.load.loaded_model import LoadedModel
from kafka_scorer.engine.prepare.prepared import PreparedJob
from kafka_scorer.engine.scorer import PackedBatch, Scorer
from kafka_scorer.engine.vision.checkpoint import VisionModel, load_vision_language
from kafka_scorer.engine.vision.forward import VisionForward, build_vision_forward, run_vision_forward
from kafka_scorer.engine.vision.images import ImageLimits
from kafka_scorer.engine.vision.layout import VisionJob
from kafka_scorer.engine.vision.preparer import VisionPreparer
from kafka_scorer.errors import SettingError
from kafka_scorer.wire.engine_stats import EngineStats, counters
from kafka_scorer.wire.protocol import Job, Result


class VisionScorer(Scorer):
    reads_images = True

    @staticmethod
    def _load(model: str, *, decoder_forward: str = "auto", **options) -> LoadedModel:
        """The checkpoint's own transformers model (`decoder_forward` chooses a text decoder's layers)."""
        return load_vision_language(model, **options)

    def __init__(
        self,
        model: str,
        *,
        max_images_per_job: int = 32,
        max_image_bytes: int = 10 * 2**20,
        max_image_pixels: int = 7680 * 4320,
        embedding_cache_mb: int = -1,
        **options,
    ) -> None:
        if options.get("deterministic"):
            raise SettingError(
                "deterministic",
                f"deterministic mode is not implemented for vision-language models ({model!r}): unset "
                "--deterministic (KAFKA_SCORER_DETERMINISTIC)",
            )
        super().__init__(model, **{**options, "prefix_cache_mb": 0})
        images = ImageLimits(max_images_per_job, max_image_bytes, max_image_pixels)
        loaded = cast(VisionModel, self.loaded)
        preparer = VisionPreparer(loaded, self._preparer.limits, images, self.template)
        self._preparer = preparer  # type: ignore[assignment]  # VisionPreparer stands in for JobPreparer (issue 40 item 2: one kind, one object)
        capacity = embedding_capacity_bytes(embedding_cache_mb)
        self._features = EmbeddingCache(capacity, (self.revision, self.dtype_name)) if capacity > 0 else None

    def _graphs_for(self, setting: int) -> None:
        return None

    @property
    def description(self) -> dict[str, str]:
        cache = self._features
        mb = f"{cache.capacity_bytes / 2**20:g}" if cache is not None else "0"
        described = {**super().description, "attention_backend": "transformers", "kind": "vision-language"}
        return {**described, "embedding_cache_mb": mb}

    @property
    def embedding_cache_stats(self) -> EmbeddingCacheStats | None:
        """The vision-feature cache's counters (`features.py`), reported as the embedding cache's."""
        return self._features.stats() if self._features is not None else None

    def stats(self) -> EngineStats:
        return replace(super().stats(), embedding_cache=counters(self.embedding_cache_stats))

    def warm_up(self) -> None:
        """One text pair and one image pair through the whole path, so a broken checkpoint or image
        processor stops the worker at start, not at its first job."""
        from kafka_scorer.engine.vision.warm_up import warm_up_jobs

        for result in self.score_jobs(warm_up_jobs(self.template is not None)):
            if not result.ok:
                raise RuntimeError(f"vision warm-up failed: {result.error}")
        if self._features is not None:
            self._features.clear()  # the warm-up's image is no traffic's

    def _build_forward(self, group: list[tuple[int, PreparedJob]]) -> tuple[list, VisionForward]:  # type: ignore[override]  # the hook returns its kind's forward (issue 40 item 2: one kind, one object)
        vision = cast("list[tuple[int, VisionJob]]", group)  # this scorer's preparer makes VisionJobs
        return group, build_vision_forward(vision, cast(VisionModel, self.loaded))

    def _run_packed_once(self, packed: PackedBatch) -> list[Result]:
        jobs = packed.runnable()
        rows: list[list[list[float]]] = [[] for _ in jobs]
        hidden: list[list[torch.Tensor]] = [[] for _ in jobs]
        for _, forward in packed.forwards:
            assert isinstance(forward, VisionForward)
            scores, states = run_vision_forward(forward, cast(VisionModel, self.loaded), self._features)
            start = 0
            for index, piece in forward.group:
                end = start + piece.num_items
                rows[index].extend(row[: len(piece.label_ids)] for row in scores[start:end].tolist())
                if piece.job.return_pooled_hidden_states:
                    hidden[index].append(states[start:end])
                start = end
        return [
            self._result(job, job_rows, job_hidden) for job, job_rows, job_hidden in zip(jobs, rows, hidden)
        ]

    def score_content(self, query: object, items: list, **fields: object) -> Result:
        """`score` for queries and items with content parts (`Scorer.score` takes text and token ids)."""
        import msgspec

        from kafka_scorer.wire.content import dec_hook

        job = msgspec.convert({"query": query, "items": items, **fields}, Job, dec_hook=dec_hook)
        return self.score_jobs([job])[0]
