"""Typed reads of a checkpoint module's parts.

`nn.Module.__getattr__` types every attribute it finds as `Tensor | Module`, so reading transformers'
layers (`layer.self_attn.q_proj`, `norm.weight`) says nothing to the type checker about what a part is.
These say it, and check it: a part that is missing or of another kind raises AttributeError, which is
what the callers already take as "this layer is not the shape we know" (`models/decoder.py` keeps
transformers' body then).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def submodule(owner: nn.Module, name: str) -> nn.Module:
    """`owner.name`, a module."""
    part = getattr(owner, name)
    if not isinstance(part, nn.Module):
        raise AttributeError(f"{type(owner).__name__}.{name} is a {type(part).__name__}, not a module")
    return part


def optional_submodule(owner: nn.Module, name: str) -> nn.Module | None:
    """`owner.name` where it is a module, None where `owner` has no such attribute or it is None."""
    part = getattr(owner, name, None)
    return None if part is None else submodule(owner, name)


def linear(owner: nn.Module, name: str) -> nn.Linear:
    """`owner.name`, a linear projection."""
    part = getattr(owner, name)
    if not isinstance(part, nn.Linear):
        raise AttributeError(f"{type(owner).__name__}.{name} is a {type(part).__name__}, not a Linear")
    return part


def tensor(owner: nn.Module, name: str) -> torch.Tensor:
    """`owner.name`, a tensor (a parameter or a buffer)."""
    part = getattr(owner, name)
    if not isinstance(part, torch.Tensor):
        raise AttributeError(f"{type(owner).__name__}.{name} is a {type(part).__name__}, not a tensor")
    return part


def model_config(owner: nn.Module) -> PretrainedConfig:
    """`owner.config`, a transformers model's configuration."""
    from transformers import PretrainedConfig

    config = getattr(owner, "config", None)
    if not isinstance(config, PretrainedConfig):
        raise AttributeError(f"{type(owner).__name__} has no transformers config")
    return config


def module_list(owner: nn.Module, name: str) -> nn.ModuleList:
    """`owner.name`, a list of modules (a model's layers)."""
    part = getattr(owner, name)
    if not isinstance(part, nn.ModuleList):
        raise AttributeError(f"{type(owner).__name__}.{name} is a {type(part).__name__}, not a ModuleList")
    return part


def number(owner: nn.Module, name: str) -> int | float:
    """`owner.name`, a plain number (a layer's head size, its scaling)."""
    value = getattr(owner, name)
    if not isinstance(value, int | float):
        raise AttributeError(f"{type(owner).__name__}.{name} is a {type(value).__name__}, not a number")
    return value
