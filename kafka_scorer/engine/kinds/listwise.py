"""A listwise reranker (jina-reranker-v3, `JinaForRanking`): a job's documents read in one causal
sequence, each scored by the cosine of its marker's projected state with the query marker's.

Loading (`engine/listwise/checkpoint.py`), the prompt (`prompt.py`), blocks (`blocks.py`), preparing
(`preparer.py`), the forward (`forward.py`) and the scores from the blocks' vectors (`fusion.py`) are
that package's. A forward's rows are vectors, not scores: a block's document vectors then its query
vector, so `finish` can fuse a job's blocks once every block has run, wherever each ran. Not for this
kind yet: deterministic mode (refused at start with the setting to change), the prefix cache and CUDA
graphs (the body is transformers' own, with a padding mask).
"""

from __future__ import annotations

from kafka_scorer.engine.config import EngineConfig
from kafka_scorer.engine.kinds.kind import KeptAcrossJobs, OwnForwards, PieceScores
from kafka_scorer.engine.kinds.served import Served, load_options, serve
from kafka_scorer.engine.listwise.checkpoint import ListwiseModel, is_listwise, load_listwise
from kafka_scorer.engine.listwise.forward import ListwiseForward, build_listwise_forward, run_listwise_forward
from kafka_scorer.engine.listwise.fusion import fused_scores, own_scores
from kafka_scorer.engine.listwise.preparer import ListwiseJob, ListwisePreparer
from kafka_scorer.engine.load.checkpoint import Checkpoint
from kafka_scorer.engine.load.start_up import StartUp
from kafka_scorer.engine.run.runner import ModelRunner
from kafka_scorer.errors import SettingError
from kafka_scorer.wire.protocol import Job

ListwisePieces = list[tuple[int, ListwiseJob]]


class ListwiseKind(KeptAcrossJobs, OwnForwards[ListwiseJob, ListwiseForward]):
    job_type = ListwiseJob
    reads_images = False

    @classmethod
    def claims(cls, checkpoint: Checkpoint) -> bool:
        return is_listwise(checkpoint.path)

    @classmethod
    def open(cls, config: EngineConfig, checkpoint: Checkpoint) -> ListwiseKind:
        for setting, value, env in (
            ("deterministic", config.deterministic, "KAFKA_SCORER_DETERMINISTIC"),
            ("template", config.template, "KAFKA_SCORER_TEMPLATE"),
        ):
            if value:
                raise SettingError(
                    setting,
                    f"{setting}={value!r} is not for the listwise model {config.model!r} (its prompt is its "
                    f"own, and deterministic mode is not implemented for it): unset --{setting} ({env})",
                )
        model = load_listwise(checkpoint.path, **load_options(config))
        return cls(serve(model, config), model)

    def __init__(self, served: Served, model: ListwiseModel) -> None:
        self.served = served
        self.model = model
        self.preparer = ListwisePreparer(self.model, served.limits)
        self.runner = ModelRunner(served.loaded)  # what the start-up line reports

    def forwards(
        self, groups: list[ListwisePieces], backend: str
    ) -> list[tuple[ListwisePieces, ListwiseForward]]:
        return [(pieces, build_listwise_forward(pieces, self.model)) for pieces in groups]

    def run(self, pieces: ListwisePieces, forward: ListwiseForward) -> list[PieceScores]:
        blocks = run_listwise_forward(forward, self.model)
        return [
            PieceScores(index, [row for block in piece for row in block.tolist()])
            for (index, _), piece in zip(forward.group, blocks)
        ]

    def finish_own(self, job: ListwiseJob, rows: list[list[float]]) -> list[list[float]]:
        """One score per document from the blocks' vectors (`fusion.py`)."""
        import torch

        vectors = torch.tensor(rows, dtype=torch.float32)
        blocks, start = [], 0
        for marks in job.markers:
            block = vectors[start : start + len(marks)]
            blocks.append((block[:-1], block[-1]))
            start += len(marks)
        scores = fused_scores(blocks) if job.fused else own_scores(blocks)
        return [[score] for score in scores]

    def describe(self, common: dict[str, str], backend: str) -> dict[str, str]:
        return {**common, "attention_backend": "transformers", "kind": "listwise"}

    def warm_up(self, parts: StartUp, backend: str) -> str:
        """One two-document job through the whole path, so a broken checkpoint stops the worker at start."""
        job = Job(id="warm-up", query="warm-up", items=["first document", "second document"])
        for result in parts.score_jobs([job], backend):
            if not result.ok:
                raise RuntimeError(f"listwise warm-up failed: {result.error}")
        return backend
