"""A vision-language (Qwen3-VL, Qwen2-VL, Qwen2.5-VL) CausalLM served as a label scorer of pairs
whose query or items carry images (SPEC §11).

Loading (`engine/vision/checkpoint.py`), preparing (`preparer.py`: prompts, image checks and
preprocessing) and the forward (`forward.py`) are that package's; image features are cached across
jobs (`features.py`, sized by `embedding_cache_mb`). Not for this kind yet: deterministic mode
(refused at start with the setting to change), the prefix cache and CUDA graphs (the decoder is
transformers' own, with a 4-D mask).
"""

from __future__ import annotations

from kafka_scorer.engine.config import EngineConfig
from kafka_scorer.engine.kinds.kind import KeptAcrossJobs, OwnForwards, PieceScores
from kafka_scorer.engine.kinds.served import Served, load_options, serve
from kafka_scorer.engine.load.checkpoint import Checkpoint
from kafka_scorer.engine.load.start_up import StartUp
from kafka_scorer.engine.run.runner import ModelRunner
from kafka_scorer.engine.vision.checkpoint import VisionModel, is_vision_language, load_vision_language
from kafka_scorer.engine.vision.forward import VisionForward, build_vision_forward, run_vision_forward
from kafka_scorer.engine.vision.images import ImageLimits
from kafka_scorer.engine.vision.layout import VisionJob
from kafka_scorer.engine.vision.preparer import VisionPreparer
from kafka_scorer.errors import SettingError

VisionPieces = list[tuple[int, VisionJob]]


class VisionKind(KeptAcrossJobs, OwnForwards[VisionJob, VisionForward]):
    job_type = VisionJob
    reads_images = True

    @classmethod
    def claims(cls, checkpoint: Checkpoint) -> bool:
        return is_vision_language(checkpoint.path)

    @classmethod
    def open(cls, config: EngineConfig, checkpoint: Checkpoint) -> VisionKind:
        if config.deterministic:
            raise SettingError(
                "deterministic",
                f"deterministic mode is not implemented for vision-language models ({config.model!r}): unset "
                "--deterministic (KAFKA_SCORER_DETERMINISTIC)",
            )
        model = load_vision_language(checkpoint.path, **load_options(config))
        return cls(serve(model, config), model)

    def __init__(self, served: Served, model: VisionModel) -> None:
        config = served.config
        self.served = served
        self.model = model
        images = ImageLimits(config.max_images_per_job, config.max_image_bytes, config.max_image_pixels)
        self.preparer = VisionPreparer(self.model, served.limits, images, served.template)
        self.runner = ModelRunner(served.loaded, labels=True)  # what the start-up line reports
        self.embeddings = served.embedding_cache()

    def forwards(self, groups: list[VisionPieces], backend: str) -> list[tuple[VisionPieces, VisionForward]]:
        return [(pieces, build_vision_forward(pieces, self.model)) for pieces in groups]

    def run(self, pieces: VisionPieces, forward: VisionForward) -> list[PieceScores]:
        scores, states = run_vision_forward(forward, self.model, self.embeddings)
        scored, start = [], 0
        for index, piece in forward.group:
            end = start + piece.num_items
            rows = [row[: len(piece.label_ids)] for row in scores[start:end].tolist()]
            hidden = states[start:end] if piece.job.return_pooled_hidden_states else None
            scored.append(PieceScores(index, rows, hidden))
            start = end
        return scored

    def describe(self, common: dict[str, str], backend: str) -> dict[str, str]:
        cache = self.embeddings
        mb = f"{cache.capacity_bytes / 2**20:g}" if cache is not None else "0"
        described = {**common, "attention_backend": "transformers", "kind": "vision-language"}
        return {**described, "embedding_cache_mb": mb}

    def warm_up(self, parts: StartUp, backend: str) -> str:
        """One text pair and one image pair through the whole path, so a broken checkpoint or image
        processor stops the worker at start, not at its first job."""
        from kafka_scorer.engine.vision.warm_up import warm_up_jobs

        for result in parts.score_jobs(warm_up_jobs(self.served.template is not None), backend):
            if not result.ok:
                raise RuntimeError(f"vision warm-up failed: {result.error}")
        self.forget()  # the warm-up's image is no traffic's
        return backend
