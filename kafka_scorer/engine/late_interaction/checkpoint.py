"""A PyLate / sentence-transformers ColBERT directory: what is read from it, and checked at load.

The layout (what `pylate.models.ColBERT.save` writes, and what the published ColBERT checkpoints ship):
- the encoder at the root (`config.json`, weights, tokenizer), module 0 of `modules.json`;
- one or more Dense projections in their own folders (`1_Dense/config.json` with `in_features`,
  `out_features`, `bias`, `activation_function`; `model.safetensors` or `pytorch_model.bin` holding
  `linear.weight` / `linear.bias`), applied in order to every token state;
- `config_sentence_transformers.json`: the query and document markers (`query_prefix`,
  `document_prefix`, tokens inserted after the first special token), `query_length`,
  `document_length`, `do_query_expansion` (pad the query to `query_length` with the mask token, every
  position kept as a query vector), `attend_to_expansion_tokens` (whether the other tokens see those
  pads), and `skiplist_words` (document tokens dropped before MaxSim, punctuation by default).
Missing keys take PyLate's defaults. Anything else (a residual Dense, an activation other than the
identity, an unknown module) is refused at load with the reason: a guess would give wrong scores.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

_ST_CONFIG = "config_sentence_transformers.json"
_IDENTITY = ("torch.nn.modules.linear.Identity", "torch.nn.Identity")


class CheckpointError(RuntimeError):
    """The directory is a ColBERT checkpoint this engine cannot serve exactly; the message says why."""


def is_late_interaction(model_path: str) -> bool:
    """A local sentence-transformers directory whose config names MaxSim or ColBERT lengths."""
    config = Path(model_path) / _ST_CONFIG
    if not (Path(model_path) / "modules.json").is_file() or not config.is_file():
        return False
    try:
        settings = json.loads(config.read_text())
    except (OSError, ValueError):
        return False
    maxsim = str(settings.get("similarity_fn_name", "")).lower() == "maxsim"
    return maxsim or "query_length" in settings or "document_length" in settings


@dataclass(frozen=True)
class ColbertSettings:
    """The encoding a ColBERT checkpoint defines (PyLate's names and defaults)."""

    query_marker: str
    document_marker: str
    query_length: int
    document_length: int
    query_expansion: bool
    attend_to_expansion: bool
    skiplist_words: tuple[str, ...]


def read_settings(model_path: str) -> ColbertSettings:
    settings = json.loads((Path(model_path) / _ST_CONFIG).read_text())

    def value(key: str, default):
        found = settings.get(key)
        return default if found is None else found

    expansion = bool(value("do_query_expansion", True))
    parsed = ColbertSettings(
        query_marker=str(value("query_prefix", "[Q] ")),
        document_marker=str(value("document_prefix", "[D] ")),
        query_length=int(value("query_length", 32)),
        document_length=int(value("document_length", 180)),
        query_expansion=expansion,
        attend_to_expansion=expansion and bool(value("attend_to_expansion_tokens", False)),
        skiplist_words=tuple(value("skiplist_words", list(string.punctuation))),
    )
    if parsed.query_length < 4 or parsed.document_length < 4:
        raise CheckpointError(
            f"{_ST_CONFIG}: query_length={parsed.query_length}, document_length={parsed.document_length}; "
            "each must leave room for the special tokens, the marker and some text (at least 4)"
        )
    return parsed


class Projection(nn.Module):
    """The checkpoint's Dense modules in order: token states [T, hidden] -> token vectors [T, dim]."""

    def __init__(self, layers: list[nn.Linear]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)

    @property
    def dim(self) -> int:
        last = self.layers[-1]
        if not isinstance(last, nn.Linear):  # never: the list is built from Linear layers only
            raise TypeError(f"a projection layer is a {type(last).__name__}, not a Linear")
        return last.out_features

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            states = layer(states)
        return states


def read_projection(model_path: str, hidden_size: int) -> Projection:
    """The Dense modules `modules.json` lists after the encoder, each checked against the previous width."""
    modules = json.loads((Path(model_path) / "modules.json").read_text())
    modules = sorted(modules, key=lambda m: int(m.get("idx", 0)))
    layers, width = [], hidden_size
    for module in modules[1:]:
        kind = str(module.get("type", ""))
        if not kind.endswith("Dense"):
            raise CheckpointError(
                f"modules.json: module {module.get('name')!r} is {kind!r}; a ColBERT checkpoint here is "
                "an encoder followed by Dense projections only"
            )
        layer = _dense(Path(model_path) / str(module.get("path", "")))
        if layer.in_features != width:
            raise CheckpointError(
                f"{module.get('path')}: in_features={layer.in_features}, but the module before gives {width}"
            )
        layers.append(layer)
        width = layer.out_features
    if not layers:
        raise CheckpointError("modules.json: no Dense projection after the encoder")
    return Projection(layers)


def _dense(folder: Path) -> nn.Linear:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{folder}: cannot read the Dense config ({exc})") from None
    activation = config.get("activation_function", _IDENTITY[0])
    if activation not in _IDENTITY or config.get("use_residual"):
        raise CheckpointError(
            f"{folder}: activation {activation!r}, use_residual={config.get('use_residual')}; only plain "
            "linear projections (identity activation, no residual) are served"
        )
    layer = nn.Linear(
        int(config["in_features"]), int(config["out_features"]), bias=bool(config.get("bias", True))
    )
    state = _dense_weights(folder)
    try:
        layer.load_state_dict({k.removeprefix("linear."): v for k, v in state.items()})
    except RuntimeError as exc:
        raise CheckpointError(f"{folder}: weights do not match config.json ({exc})") from None
    return layer


def _dense_weights(folder: Path) -> dict[str, torch.Tensor]:
    if (folder / "model.safetensors").is_file():
        from safetensors.torch import load_file

        return load_file(str(folder / "model.safetensors"))
    if (folder / "pytorch_model.bin").is_file():
        return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise CheckpointError(f"{folder}: no model.safetensors or pytorch_model.bin")
