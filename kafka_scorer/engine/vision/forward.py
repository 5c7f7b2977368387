"""One forward of vision pairs: right-padded token rows, their images, the model's own forward.

The pairs of a planned forward (any jobs' pieces) become one padded batch: `input_ids` and an
attention mask, every pair's image patches concatenated in row order (the order the model matches
image features to `<|image_pad|>` tokens), and their grids. transformers' Qwen3-VL forward then runs
the vision tower once over all the batch's images, places their features, computes each row's 3-D
M-RoPE positions from its own tokens and grids (padding excluded by the mask), and runs the decoder.
The scoring row of a pair is its last real token's final-norm hidden state; the label scores come from
the engine's CausalLM head code (`engine/heads.py`), the same as every text job's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch

from kafka_scorer.engine.run.heads import causal_label_scores
from kafka_scorer.engine.vision.checkpoint import VisionModel
from kafka_scorer.engine.vision.preparer import VisionJob


@dataclass
class VisionForward:
    group: list[tuple[int, VisionJob]]
    inputs: dict[str, torch.Tensor]
    last: torch.Tensor
    """[rows]: the index of each row's last real token."""
    label_ids: torch.Tensor
    label_mask: torch.Tensor
    softmax_rows: torch.Tensor


def build_vision_forward(group: list[tuple[int, VisionJob]], model: VisionModel) -> VisionForward:
    rows = [(ids, piece) for _, piece in group for ids in piece.items]
    width = max(len(ids) for ids, _ in rows)
    tokenizer: Any = cast(Any, model.tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for row, (ids, _) in enumerate(rows):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        mask[row, : len(ids)] = 1
    inputs = {"input_ids": input_ids, "attention_mask": mask}
    pixels = [p for _, piece in group for p in piece.pixels if p is not None]
    if pixels:
        inputs["pixel_values"] = torch.cat(pixels)
        inputs["image_grid_thw"] = torch.cat([g for _, piece in group for g in piece.grids if g is not None])
        if model.marks_image_tokens:  # newer transformers want the image tokens marked
            inputs["mm_token_type_ids"] = (input_ids == model.image_token_id).long() * mask
    labels = max(len(piece.label_ids) for _, piece in rows)
    label_ids = torch.zeros((len(rows), labels), dtype=torch.long)
    label_mask = torch.zeros((len(rows), labels), dtype=torch.bool)
    for row, (_, piece) in enumerate(rows):
        label_ids[row, : len(piece.label_ids)] = torch.tensor(piece.label_ids)
        label_mask[row, : len(piece.label_ids)] = True
    softmax = torch.tensor([piece.activation == "softmax" for _, piece in rows])
    return VisionForward(group, inputs, mask.sum(1) - 1, label_ids, label_mask, softmax)


@torch.inference_mode()
def run_vision_forward(forward: VisionForward, model: VisionModel) -> tuple[torch.Tensor, torch.Tensor]:
    """[rows, labels] float32 scores and [rows, hidden] scoring rows, both on the CPU."""
    device = model.device
    inputs = {name: tensor.to(device) for name, tensor in forward.inputs.items()}
    if "pixel_values" in inputs:
        inputs["pixel_values"] = inputs["pixel_values"].to(model.dtype)
    hidden = model.body(**inputs, use_cache=False).last_hidden_state
    rows = hidden[torch.arange(hidden.shape[0], device=device), forward.last.to(device)]
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
