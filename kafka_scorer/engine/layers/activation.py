"""The gated MLP activation over one merged gate/up projection: `act(gate) · up`.

The merged matmul's output holds gate then up; splitting it is a view, and under `torch.compile` the
activation and the product are one kernel that writes only the [T, I] result.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gated(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    """[T, 2I] -> [T, I]: `silu` (Llama, Qwen) or `gelu_tanh` (Gemma 2)."""
    gate, up = gate_up.chunk(2, dim=-1)
    if activation == "silu":
        return F.silu(gate) * up
    return F.gelu(gate, approximate="tanh") * up


ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}
"""transformers' `hidden_act` names -> the activations `gated` computes."""
