"""What the three kinds of a plain transformers checkpoint share: a decoder label scorer, a decoder
classifier and an encoder cross-encoder all prepare text and token ids the same way
(`engine/prepare/inputs.py`), pack one flat stream (`engine/pack/batch.py`), run it through the
model's body and gather the scoring rows (`engine/run/runner.py`). What differs (a row's width, which
settings apply, how a pair is laid out) is each kind's own file.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping

from kafka_scorer.engine.config import EngineConfig
from kafka_scorer.engine.graphs.forward_graphs import graphs_for
from kafka_scorer.engine.kinds.kind import Group, KeptAcrossJobs, OwnForwards, PieceScores
from kafka_scorer.engine.kinds.served import Served, serve
from kafka_scorer.engine.load.checkpoint import Checkpoint
from kafka_scorer.engine.load.decoder import load_decoder
from kafka_scorer.engine.load.start_up import StartUp
from kafka_scorer.engine.models.loaded import Architecture, LoadedModel
from kafka_scorer.engine.pack.batch import ForwardBatch, build_forward_batch
from kafka_scorer.engine.pack.prefix_batch import PrefixPlanner, cached_tokens, prefix_planner
from kafka_scorer.engine.pack.stream_shape import CAUSAL_STREAM, StreamShape
from kafka_scorer.engine.prepare.inputs import JobPreparer
from kafka_scorer.engine.prepare.prepared import PreparedJob
from kafka_scorer.engine.prepare.score_fields import ClassFields, ScoreFields
from kafka_scorer.engine.run.runner import CAUSAL_BODY, ModelRunner


class TextKind(KeptAcrossJobs, OwnForwards[PreparedJob, ForwardBatch]):
    job_type = PreparedJob
    reads_images = False
    preparer_class: type[JobPreparer] = JobPreparer
    scores_labels = False
    """Whether rows are label tokens' scores from the LM head (`run/runner.py`), else the head's classes."""
    architecture = Architecture.CLASSIFICATION
    """The head a decoder of this kind is loaded with (`load`)."""
    shape: StreamShape = CAUSAL_STREAM
    """How a sequence of the packed stream is laid out (`pack/stream_shape.py`): a decoder's here."""
    body_options: Mapping[str, object] = CAUSAL_BODY
    """What the model body is called with beside the stream (`run/runner.py`): a decoder's here."""

    @classmethod
    @abstractmethod
    def claims(cls, checkpoint: Checkpoint) -> bool:
        """Whether the checkpoint's config names this kind (`engine/load/checkpoint.py`)."""

    @classmethod
    def open(cls, config: EngineConfig, checkpoint: Checkpoint) -> TextKind:
        """The kind refuses settings that are not for it before anything loads, then loads its own way."""
        cls.check_settings(config)
        return cls(serve(cls.load(config, checkpoint), config))

    @classmethod
    def check_settings(cls, config: EngineConfig) -> None:
        """Refuse, in one line naming the setting, what this kind cannot honour (nothing here)."""

    @classmethod
    def load(cls, config: EngineConfig, checkpoint: Checkpoint) -> LoadedModel:
        """The checkpoint's weights as this kind runs them: a decoder with the head `architecture`
        names (`engine/load/decoder.py`; the cross-encoder loads its own way)."""
        return load_decoder(
            checkpoint,
            cls.architecture,
            served_name=config.served_model_name,
            dtype=config.dtype,
            device=config.device,
            decoder_forward=config.decoder_forward,
        )

    def __init__(self, served: Served) -> None:
        loaded = served.loaded
        self.served = served
        self.preparer = self.preparer_class(loaded, served.limits, served.template, self.score_fields(served))
        # None where a cache cannot be exact (bidirectional attention, a sliding window: `prefix_planner`)
        self.prefixes: PrefixPlanner | None = prefix_planner(loaded, served.prefix_cache_mb, served.revision)
        setting = served.config.cuda_graph_tokens
        chosen = None
        if not served.config.deterministic:  # none in deterministic mode (tiled attention)
            chosen = graphs_for(
                loaded.body, loaded.device, setting, served.max_batch_tokens, loaded.sliding_window
            )
        self.runner = ModelRunner(
            loaded,
            served.config.deterministic,
            chosen,
            labels=self.scores_labels,
            body_options=self.body_options,
        )

    def forwards(self, groups: list[Group], backend: str) -> list[tuple[Group, ForwardBatch]]:
        """Through the prefix cache (`engine/pack/prefix_batch.py`) groups come back reordered, after
        forwards of no group that compute their new heads."""
        loaded = self.served.loaded
        if self.prefixes is None:
            return [(group, self._batch(group, backend)) for group in groups]
        return self.prefixes.build_all(
            groups,
            device=loaded.device,
            attention_backend=backend,
            sliding_window=loaded.sliding_window,
            pad_to=self._pad_to,
        )

    def _batch(self, group: Group, backend: str) -> ForwardBatch:
        loaded = self.served.loaded
        return build_forward_batch(
            [piece for _, piece in group],
            device=loaded.device,
            attention_backend=backend,
            sliding_window=loaded.sliding_window,
            shape=self.shape,
            pad_to=self._pad_to,
        )

    @property
    def _pad_to(self):
        """The packing thread pads a forward to its CUDA graph's bucket once graphs are captured (the
        warm-up captures them over the flex backend only)."""
        graphs = self.runner.graphs
        return graphs.bucket_for if graphs is not None else None

    def run(self, pieces: Group, forward: ForwardBatch) -> list[PieceScores]:
        output = self.runner.forward(forward)
        if self.prefixes is not None:
            self.prefixes.commit(forward)
        scores = output.scores.tolist()
        scored, offset = [], 0
        for (index, piece), (start, end) in zip(pieces, forward.job_rows):
            rows = [row[: self.width(piece, row)] for row in scores[start:end]]
            hidden = None
            if piece.job.return_pooled_hidden_states:
                hidden = output.hidden[offset : offset + end - start]
                offset += end - start
            scored.append(PieceScores(index, rows, hidden, cached_tokens(piece), cached_once=piece.packed))
        return scored

    def score_fields(self, served: Served) -> ScoreFields:
        """What this kind's scores are (`engine/prepare/score_fields.py`): a head's classes here."""
        return ClassFields(served.loaded.num_classes, served.template)

    def width(self, piece: PreparedJob, row: list[float]) -> int:
        """A row's scores: the classes of a classifier's head (every column)."""
        return len(row)

    def describe(self, common: dict[str, str], backend: str) -> dict[str, str]:
        return common

    def warm_up(self, parts: StartUp, backend: str) -> str:
        from kafka_scorer.engine.load.warm_up import warm_up

        return warm_up(parts, backend)
