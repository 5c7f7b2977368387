"""A model kind written for the tests, whole in this file: what adding a kind takes (`engine/kinds/kind.py`).

A bi-encoder: the query and each item are encoded apart by a plain transformers encoder, mean-pooled
over their tokens, and an item's score is the cosine of its vector with the query's. Its checkpoint is
an encoder directory with a `bi_encoder.json` beside the weights; it loads its own way (transformers'
`AutoModel` with eager attention: none of the engine's attention), prepares its own jobs (the query and
the items tokenized apart), builds and runs its own forward (one padded batch of every sequence), and
reaches the engine through one selector line: `ScoringEngine(config, kinds=(BiEncoderKind, *KINDS))`.
It refuses what it does not do with a typed error (documents, deterministic mode, templates).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from kafka_scorer.engine.config import EngineConfig
from kafka_scorer.engine.kinds.kind import KeptAcrossJobs, OwnForwards, PieceScores
from kafka_scorer.engine.kinds.served import Served, serve
from kafka_scorer.engine.load.checkpoint import Checkpoint
from kafka_scorer.engine.load.revision import checkpoint_revision
from kafka_scorer.engine.load.start_up import StartUp
from kafka_scorer.engine.load.transformers_parts import load_tokenizer, resolve_device, resolve_dtype
from kafka_scorer.engine.models.loaded import Architecture, LoadedModel
from kafka_scorer.engine.prepare.prepared import InputError, InputLimits, PreparedJob
from kafka_scorer.engine.run.runner import ModelRunner
from kafka_scorer.errors import SettingError
from kafka_scorer.wire.protocol import ErrorCode, Job, Result, TemplateRef

MARKER = "bi_encoder.json"

BiPieces = list[tuple[int, PreparedJob]]


def mean_vectors(body: torch.nn.Module, sequences: list[list[int]]) -> torch.Tensor:
    """Each sequence's mean token state, from one padded forward ([S, hidden], float32)."""
    longest = max(len(ids) for ids in sequences)
    ids = torch.tensor([seq + [0] * (longest - len(seq)) for seq in sequences])
    mask = torch.tensor([[1] * len(seq) + [0] * (longest - len(seq)) for seq in sequences])
    device = next(body.parameters()).device
    states = body(input_ids=ids.to(device), attention_mask=mask.to(device))[0].float()
    weights = mask.to(states.device, states.dtype)[..., None]
    return (states * weights).sum(1) / weights.sum(1)


@dataclass
class BiForward:
    sequences: list[list[int]]
    """Each piece's query, then its items."""
    counts: list[int]
    """Each piece's item count."""


class BiPreparer:
    def __init__(self, loaded: LoadedModel, limits: InputLimits) -> None:
        self.loaded = loaded
        self._limits = limits

    @property
    def limits(self) -> InputLimits:
        return self._limits

    def template_for(self, job: Job) -> TemplateRef | None:
        return None

    def prepare(self, job: Job, job_id: str) -> PreparedJob | Result:
        if job.model is not None and job.model != self.loaded.name:
            raise InputError(ErrorCode.MODEL_MISMATCH, f"model {job.model!r}: this worker serves another")
        if not isinstance(job.items, list) or isinstance(job.documents, list):
            raise InputError(ErrorCode.UNSUPPORTED, "the bi-encoder test kind scores `items` only")
        if len(job.items) > self.limits.max_items_per_job:
            raise InputError(ErrorCode.TOO_LONG, f"{len(job.items)} items > {self.limits.max_items_per_job}")
        query = self._ids(job.query)
        items = [self._ids(item) for item in job.items]
        return PreparedJob(
            job_id=job_id,
            job=job,
            query=query,
            items=items,
            packed=True,
            label_ids=[],
            num_tokens=len(query) + sum(len(item) for item in items),
        )

    def _ids(self, value: object) -> list[int]:
        if isinstance(value, str):
            if self.loaded.tokenizer is None:
                raise InputError(ErrorCode.UNSUPPORTED, "no tokenizer: send token ids")
            return list(self.loaded.tokenizer(value)["input_ids"])
        if isinstance(value, list) and value and all(isinstance(t, int) for t in value):
            if max(value) >= self.loaded.input_vocab_size or min(value) < 0:
                raise InputError(ErrorCode.INVALID_REQUEST, "a token id outside the vocabulary")
            return list(value)
        raise InputError(
            ErrorCode.UNSUPPORTED, f"the bi-encoder test kind does not read {type(value).__name__}"
        )


class BiEncoderKind(KeptAcrossJobs, OwnForwards[PreparedJob, BiForward]):
    job_type = PreparedJob
    reads_images = False

    @classmethod
    def claims(cls, checkpoint: Checkpoint) -> bool:
        return (Path(checkpoint.path) / MARKER).is_file()

    @classmethod
    def open(cls, config: EngineConfig, checkpoint: Checkpoint) -> BiEncoderKind:
        for setting, value in (("deterministic", config.deterministic), ("template", config.template)):
            if value:
                raise SettingError(setting, f"{setting} is not for the bi-encoder test kind: unset it")
        return cls(serve(load_bi_encoder(checkpoint, config), config))

    def __init__(self, served: Served) -> None:
        self.served = served
        self.preparer = BiPreparer(served.loaded, served.limits)
        self.runner = ModelRunner(served.loaded)  # what the start-up line reports

    def forwards(self, groups: list[BiPieces], backend: str) -> list[tuple[BiPieces, BiForward]]:
        return [(pieces, _forward(pieces)) for pieces in groups]

    def run(self, pieces: BiPieces, forward: BiForward) -> list[PieceScores]:
        vectors = mean_vectors(self.served.loaded.body, forward.sequences)
        scored, row = [], 0
        for (index, _), count in zip(pieces, forward.counts):
            query, items = vectors[row], vectors[row + 1 : row + 1 + count]
            cosines = torch.nn.functional.cosine_similarity(items, query[None], dim=-1)
            scored.append(PieceScores(index, [[score] for score in cosines.tolist()]))
            row += 1 + count
        return scored

    def describe(self, common: dict[str, str], backend: str) -> dict[str, str]:
        return {**common, "kind": "bi-encoder", "attention_backend": "eager"}

    def warm_up(self, parts: StartUp, backend: str) -> str:
        return backend


def _forward(pieces: BiPieces) -> BiForward:
    sequences = [seq for _, piece in pieces for seq in (piece.query, *piece.items)]
    return BiForward(sequences, [piece.num_items for _, piece in pieces])


def load_bi_encoder(checkpoint: Checkpoint, config: EngineConfig) -> LoadedModel:
    from transformers import AutoModel

    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    model = AutoModel.from_pretrained(checkpoint.path, dtype=dtype, attn_implementation="eager")
    model.to(device).eval()
    model.requires_grad_(False)
    return LoadedModel(
        name=config.served_model_name or checkpoint.path,
        architecture=Architecture.CLASSIFICATION,
        model=model,
        body=model,
        head=torch.nn.Identity(),
        tokenizer=load_tokenizer(checkpoint),
        device=device,
        dtype=dtype,
        input_vocab_size=int(model.config.vocab_size),
        output_vocab_size=int(model.config.vocab_size),
        max_positions=int(model.config.max_position_embeddings),
        mis_block_reason="each sequence is encoded alone",
        sliding_window=None,
        revision=checkpoint_revision(checkpoint.path),
    )
