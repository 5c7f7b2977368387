"""A late-interaction (ColBERT) checkpoint: per-token vectors scored by MaxSim.

Its checkpoint is a ColBERT directory (`engine/late_interaction/loading.py`); its preparer encodes a
query and each document as the checkpoint defines (`preparer.py`); a forward runs the queries and the
documents not in the embedding cache in one encoder pass, then MaxSim per job (`forward.py`). Results
carry one column, the MaxSim score of each item, and `cached_tokens` counts the document tokens whose
vectors came from the cache. Equal documents of one job get the first one's score.
"""

from __future__ import annotations

from kafka_scorer.engine.config import EngineConfig
from kafka_scorer.engine.kinds.kind import KeptAcrossJobs, OwnForwards, PieceScores
from kafka_scorer.engine.kinds.served import Served, load_options, serve
from kafka_scorer.engine.late_interaction.checkpoint import is_late_interaction
from kafka_scorer.engine.late_interaction.forward import LateForward, build_late_forward, run_late_forward
from kafka_scorer.engine.late_interaction.loading import load_late_interaction
from kafka_scorer.engine.late_interaction.preparer import LateJob, LatePreparer
from kafka_scorer.engine.late_interaction.spec import LateModel
from kafka_scorer.engine.load.checkpoint import Checkpoint
from kafka_scorer.engine.load.start_up import StartUp
from kafka_scorer.engine.run.runner import ModelRunner
from kafka_scorer.errors import SettingError

LatePieces = list[tuple[int, LateJob]]


class LateInteractionKind(KeptAcrossJobs, OwnForwards[LateJob, LateForward]):
    job_type = LateJob
    reads_images = False

    @classmethod
    def claims(cls, checkpoint: Checkpoint) -> bool:
        return is_late_interaction(checkpoint.path)

    @classmethod
    def open(cls, config: EngineConfig, checkpoint: Checkpoint) -> LateInteractionKind:
        if config.template:
            raise SettingError(
                "template",
                f"template={config.template!r} but {config.model!r} is a late-interaction (ColBERT) model, "
                "which encodes as it defines: unset --template (KAFKA_SCORER_TEMPLATE) for it",
            )
        model = load_late_interaction(checkpoint.path, **load_options(config))
        return cls(serve(model, config), model)

    def __init__(self, served: Served, model: LateModel) -> None:
        self.served = served
        self.model = model
        self.preparer = LatePreparer(self.model, served.limits)
        self.runner = ModelRunner(served.loaded, served.config.deterministic)
        self.embeddings = served.embedding_cache()

    def forwards(self, groups: list[LatePieces], backend: str) -> list[tuple[LatePieces, LateForward]]:
        """Deterministic mode's attention where it is on, else the pair groups (`forward.py`)."""
        tiles = backend if self.served.config.deterministic else None
        return [(pieces, build_late_forward(pieces, self.model, self.embeddings, tiles)) for pieces in groups]

    def run(self, pieces: LatePieces, forward: LateForward) -> list[PieceScores]:
        scores = run_late_forward(forward, self.model, self.embeddings)
        return [
            PieceScores(index, [[score] for score in piece_scores], cached=piece_cached)
            for (index, _), piece_scores, piece_cached in zip(forward.group, scores, forward.cached_tokens)
        ]

    def finish_own(self, job: LateJob, rows: list[list[float]]) -> list[list[float]]:
        return same_rows_for_equal_documents(job, rows)

    def describe(self, common: dict[str, str], backend: str) -> dict[str, str]:
        cache = self.embeddings
        mb = f"{cache.capacity_bytes / 2**20:g}" if cache is not None else "0"
        # its forwards use the pair groups, or deterministic mode's tiles, whatever backend was configured
        shown = backend if self.served.config.deterministic else "cascade"
        return {**common, "attention_backend": shown, "embedding_cache_mb": mb}

    def warm_up(self, parts: StartUp, backend: str) -> str:
        from kafka_scorer.engine.load.warm_up import warm_up

        return warm_up(parts, backend)  # which empties the kind's caches after the warm-up's documents


def same_rows_for_equal_documents(job: LateJob, rows: list[list[float]]) -> list[list[float]]:
    """Each document (or window) whose tokens equal an earlier one's takes that one's row.

    A job larger than the token budget is cut into pieces run in different forwards, and a forward's
    sequences are computed beside different batch-mates (their length buckets, the row count of every
    projection), so two copies of a document in different pieces came back a few ulps apart and ranked
    by that noise, not by index. Their inputs are the same tokens: the first copy's score is theirs.
    Within one forward a recurring document already runs once (`forward.py`)."""
    first: dict[bytes, int] = {}
    return [list(rows[first.setdefault(key, index)]) for index, key in enumerate(job.doc_keys)]
