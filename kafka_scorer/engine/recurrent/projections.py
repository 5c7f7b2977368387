"""The input projections of a Gated DeltaNet layer, read into one shape whatever the family's layout.

Qwen3.5 projects q|k|v, the output gate z and the per-head b (write strength) and a (decay) with four
separate matrices; Qwen3-Next packs them into two (`in_proj_qkvz`, `in_proj_ba`) grouped by key head,
which its own `fix_query_key_value_ordering` unpacks. Everything after the projections (the short
convolution, the delta rule, the gated norm, the output projection) is the same in both, so
`gated_delta.py` computes it once over `GatedDeltaInputs`. All of it is per token: it runs over the
whole packed stream at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from kafka_scorer.engine.layers.parts import number, submodule


@dataclass(frozen=True)
class GatedDeltaInputs:
    mixed: torch.Tensor
    """[T, 2·key_dim + value_dim] q | k | v before the short convolution."""
    z: torch.Tensor
    """[T, value_heads, value_head_dim] the output gate."""
    b: torch.Tensor
    """[T, value_heads] before the sigmoid that makes it β."""
    a: torch.Tensor
    """[T, value_heads] before the softplus that makes it the decay."""


Projections = Callable[[nn.Module, torch.Tensor], GatedDeltaInputs]


def separate_projections(layer: nn.Module, hidden: torch.Tensor) -> GatedDeltaInputs:
    """Qwen3.5 (dense and MoE): `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`."""
    tokens = hidden.shape[0]
    return GatedDeltaInputs(
        mixed=submodule(layer, "in_proj_qkv")(hidden),
        z=submodule(layer, "in_proj_z")(hidden).reshape(tokens, -1, int(number(layer, "head_v_dim"))),
        b=submodule(layer, "in_proj_b")(hidden),
        a=submodule(layer, "in_proj_a")(hidden),
    )


def grouped_projections(layer: nn.Module, hidden: torch.Tensor) -> GatedDeltaInputs:
    """Qwen3-Next: `in_proj_qkvz` and `in_proj_ba`, unpacked by the layer's own method."""
    tokens = hidden.shape[0]
    query, key, value, z, b, a = _qkvz_ordering(layer)(
        submodule(layer, "in_proj_qkvz")(hidden)[None], submodule(layer, "in_proj_ba")(hidden)[None]
    )
    mixed = torch.cat([part.reshape(tokens, -1) for part in (query, key, value)], dim=-1)
    return GatedDeltaInputs(mixed=mixed, z=z[0], b=b[0], a=a[0])


def _qkvz_ordering(layer: nn.Module) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]:
    """Qwen3-Next's own method (`fix_query_key_value_ordering`) that unpacks its grouped projections
    [1, T, ·] into query, key, value, z, b and a."""
    method = getattr(layer, "fix_query_key_value_ordering", None)
    if not callable(method):
        raise AttributeError(f"{type(layer).__name__} has no fix_query_key_value_ordering method")
    return method


_SHARED: tuple[str, ...] = ("conv1d", "A_log", "dt_bias", "norm", "out_proj", "key_dim", "value_dim")
_SHARED += ("head_k_dim", "head_v_dim", "conv_kernel_size", "activation")
_LAYOUTS: tuple[tuple[tuple[str, ...], Projections], ...] = (
    (("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"), separate_projections),
    (("in_proj_qkvz", "in_proj_ba", "fix_query_key_value_ordering"), grouped_projections),
)


def projections_for(layer: nn.Module) -> Projections | None:
    """The reader of `layer`'s projections, or None when it does not have the parts this engine reads."""
    if not all(hasattr(layer, name) for name in _SHARED):
        return None
    for names, read in _LAYOUTS:
        if all(hasattr(layer, name) for name in names):
            return read
    return None
