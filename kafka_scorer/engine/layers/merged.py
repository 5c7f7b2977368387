"""Projections that read the same input, merged into one matmul at load (q/k/v; gate/up).

The merged weight is one new tensor; each original projection's weight (and bias) is then pointed at
its slice of it, so the checkpoint's modules still work (the load-time probes run them) and the
weights are held once.
"""

from __future__ import annotations

import torch
from torch import nn


def merge(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One [sum(out), in] weight (and bias, if any has one) from projections of a shared input."""
    weight = torch.cat([linear.weight.detach() for linear in linears])
    has_bias = any(linear.bias is not None for linear in linears)
    bias = None
    if has_bias:
        bias = torch.cat(
            [
                linear.bias.detach() if linear.bias is not None else weight.new_zeros(linear.out_features)
                for linear in linears
            ]
        )
    start = 0
    for linear in linears:
        end = start + linear.out_features
        linear.weight = nn.Parameter(weight[start:end], requires_grad=False)
        if linear.bias is not None and bias is not None:
            linear.bias = nn.Parameter(bias[start:end], requires_grad=False)
        start = end
    return weight, bias
