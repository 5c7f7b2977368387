"""One forward of vision jobs: padded rows, a 4-D attention mask, the model's own M-RoPE positions.

A row is one pair, or one packed job (its prefix, then every item). The rows of a planned forward
(any jobs' pieces) are right-padded into one batch; every row's images are concatenated in row and
token order (the order the model matches image features to `<|image_pad|>` tokens); the positions
are those the preparer computed with the model's own `get_rope_index`, each item's as in its pair
alone. The mask lets a token see the earlier tokens of its own segment and the row's prefix: a pair
row is one causal segment, a packed row's items are segments after a shared prefix (MIS); a padding
token sees itself only. The vision tower runs once over all the batch's images not in the feature
cache (`features.py`), their features and deepstack features are placed as transformers' Qwen3-VL
forward places them, and its decoder runs with that mask.
The scoring row of an item is its last token's final-norm hidden state; the label scores come from
the engine's CausalLM head code (`engine/run/heads.py`), the same as every text job's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch

from kafka_scorer.engine.run.heads import causal_label_scores
from kafka_scorer.engine.vision.checkpoint import VisionModel
from kafka_scorer.engine.vision.features import decoder_hidden, image_features
from kafka_scorer.engine.vision.layout import Images, VisionJob
from kafka_scorer.engine.vision.prompt import ProcessedImage

if TYPE_CHECKING:
    from kafka_scorer.engine.pack.embedding_cache import EmbeddingCache


@dataclass
class Row:
    """One sequence of the batch: its ids, positions [3, L], segment of each token (0: the shared
    prefix, seen by all), the index of each item's scoring token, and its images in token order."""

    ids: list[int] = field(default_factory=list)
    positions: list[torch.Tensor] = field(default_factory=list)
    segments: list[int] = field(default_factory=list)
    scoring: list[int] = field(default_factory=list)
    images: list[Images] = field(default_factory=list)

    def add(self, ids: list[int], positions: torch.Tensor, images: Images, segment: int) -> None:
        self.ids += ids
        self.positions.append(positions)
        self.segments += [segment] * len(ids)
        self.images.append(images)
        if segment:
            self.scoring.append(len(self.ids) - 1)


def rows_of(piece: VisionJob) -> list[Row]:
    if not piece.packed:
        rows = [Row() for _ in piece.items]
        for row, ids, positions, images in zip(rows, piece.items, piece.positions, piece.images):
            row.add(ids, positions, images, 1)
        return rows
    row = Row()
    assert piece.query_positions is not None
    row.add(piece.query, piece.query_positions, piece.query_images, 0)
    for segment, (ids, positions, images) in enumerate(zip(piece.items, piece.positions, piece.images), 1):
        row.add(ids, positions, images, segment)
    return [row]


@dataclass
class VisionForward:
    group: list[tuple[int, VisionJob]]
    inputs: dict[str, torch.Tensor]
    images: list[ProcessedImage]
    """Every image of the batch in row and token order."""
    scoring: tuple[torch.Tensor, torch.Tensor]
    """(batch row, token) of each item's scoring token, in the group's item order."""
    label_ids: torch.Tensor
    label_mask: torch.Tensor
    softmax_rows: torch.Tensor


def build_vision_forward(group: list[tuple[int, VisionJob]], model: VisionModel) -> VisionForward:
    rows = [row for _, piece in group for row in rows_of(piece)]
    tokenizer: Any = cast(Any, model.tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    width = max(len(row.ids) for row in rows)
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    positions = torch.zeros((3, len(rows), width), dtype=torch.long)
    mask = torch.eye(width, dtype=torch.bool).repeat(len(rows), 1, 1, 1)  # [rows, 1, width, width]
    for index, row in enumerate(rows):
        length = len(row.ids)
        input_ids[index, :length] = torch.tensor(row.ids)
        positions[:, index, :length] = torch.cat(row.positions, dim=1)
        mask[index, 0, :length, :length] = _row_mask(torch.tensor(row.segments))
    inputs = {"input_ids": input_ids, "position_ids": positions, "attention_mask": mask}
    images = [image for row in rows for images in row.images for image in images.found]
    batch_rows = [index for index, row in enumerate(rows) for _ in row.scoring]
    tokens = [token for row in rows for token in row.scoring]
    jobs = [piece for _, piece in group for _ in piece.items]
    labels = max(len(piece.label_ids) for piece in jobs)
    label_ids = torch.zeros((len(jobs), labels), dtype=torch.long)
    label_mask = torch.zeros((len(jobs), labels), dtype=torch.bool)
    for index, piece in enumerate(jobs):
        label_ids[index, : len(piece.label_ids)] = torch.tensor(piece.label_ids)
        label_mask[index, : len(piece.label_ids)] = True
    softmax = torch.tensor([piece.activation == "softmax" for piece in jobs])
    scoring = (torch.tensor(batch_rows), torch.tensor(tokens))
    return VisionForward(group, inputs, images, scoring, label_ids, label_mask, softmax)


def _row_mask(segments: torch.Tensor) -> torch.Tensor:
    """[L, L] bool: causal, within a token's own segment or the shared prefix (segment 0)."""
    length = segments.numel()
    causal = torch.ones((length, length), dtype=torch.bool).tril()
    visible = (segments[:, None] == segments[None, :]) | (segments[None, :] == 0)
    return causal & visible


@torch.inference_mode()
def run_vision_forward(
    forward: VisionForward, model: VisionModel, cache: EmbeddingCache | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """[items, labels] float32 scores and [items, hidden] scoring rows, both on the CPU."""
    device = model.device
    inputs = {name: tensor.to(device) for name, tensor in forward.inputs.items()}
    hidden = decoder_hidden(model, inputs, image_features(model, forward.images, cache))
    batch_rows, tokens = forward.scoring
    rows = hidden[batch_rows.to(device), tokens.to(device)]
    softmax_rows = forward.softmax_rows.to(device)
    scores = causal_label_scores(
        rows,
        model.head,
        forward.label_ids.to(device),
        forward.label_mask.to(device),
        softmax_rows,
        need_softmax=bool(forward.softmax_rows.any()),
        need_logprob=not bool(forward.softmax_rows.all()),
        backend="torch",
    )
    return scores.cpu(), rows.cpu()
