"""One listwise forward: the block prompts of many jobs, each its own causal sequence.

Built on the packing thread: the prompts are laid side by side, right-padded to the longest, with an
attention mask, so a prompt's tokens see only the tokens before them in the same prompt and padding
only ever follows them (nothing crosses between prompts, so a job's vectors are the ones it gets
alone). Run on the device thread: transformers' `Qwen3Model` over the batch, then the projector over
just the marker rows. Padding costs the difference to the longest prompt; a forward's prompts are
those of one planned group (the token budget), so it stays bounded by what the budget admits.

On the CPU each prompt runs alone instead, unpadded and without a mask: a padding mask takes SDPA off
its causal path, and two jobs of 3,285 tokens in one padded batch ran at 0.68x the transformers
reference one job at a time, against 1.04x one job per forward (`kafka-scorer bench --workload
listwise`, 2026-12-06). A prompt of a few thousand tokens already fills the CPU's cores; on CUDA the
padded batch stays (not measured there yet).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kafka_scorer.engine.listwise.checkpoint import ListwiseModel
from kafka_scorer.engine.listwise.preparer import ListwiseJob


@dataclass
class ListwiseForward:
    group: list[tuple[int, ListwiseJob]]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    rows: torch.Tensor
    """Flat positions (batch row x width + position) of every marker, block by block."""
    lengths: list[int]
    """Each prompt's own length (the mask's ones)."""


def build_listwise_forward(group: list[tuple[int, ListwiseJob]], model: ListwiseModel) -> ListwiseForward:
    prompts = [(ids, marks) for _, job in group for ids, marks in zip(job.items, job.markers)]
    width = max(len(ids) for ids, _ in prompts)
    input_ids = torch.full((len(prompts), width), model.pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    rows: list[int] = []
    for row, (ids, marks) in enumerate(prompts):
        input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        mask[row, : len(ids)] = 1
        rows.extend(row * width + position for position in marks)
    lengths = [len(ids) for ids, _ in prompts]
    return ListwiseForward(group, input_ids, mask, torch.tensor(rows, dtype=torch.long), lengths)


@torch.inference_mode()
def run_listwise_forward(forward: ListwiseForward, model: ListwiseModel) -> list[list[torch.Tensor]]:
    """Each piece's blocks' projected marker vectors (documents then query), in float32 on the CPU."""
    device = model.device
    hidden = _prompts_alone(forward, model) if device.type == "cpu" else _padded_batch(forward, model)
    flat = hidden.reshape(-1, hidden.shape[-1]).index_select(0, forward.rows.to(device))
    vectors = model.head(flat).float().cpu()
    out, start = [], 0
    for _, job in forward.group:
        blocks = []
        for marks in job.markers:
            blocks.append(vectors[start : start + len(marks)])
            start += len(marks)
        out.append(blocks)
    return out


def _padded_batch(forward: ListwiseForward, model: ListwiseModel) -> torch.Tensor:
    device = model.device
    return model.body(
        input_ids=forward.input_ids.to(device), attention_mask=forward.attention_mask.to(device)
    ).last_hidden_state


def _prompts_alone(forward: ListwiseForward, model: ListwiseModel) -> torch.Tensor:
    """The batch's hidden states with each prompt run by itself (rows past its length stay zero: no
    marker points there)."""
    rows = []
    for row, length in enumerate(forward.lengths):
        alone = model.body(input_ids=forward.input_ids[row : row + 1, :length].to(model.device))
        rows.append(
            torch.nn.functional.pad(alone.last_hidden_state, (0, 0, 0, forward.input_ids.shape[1] - length))
        )
    return torch.cat(rows)
