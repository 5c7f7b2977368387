"""Finding a decoder's stateful layers at load time: wrap the ones run exactly, refuse the model otherwise.

A layer carries state along the sequence when its output at a token depends on a convolution window or
a recurrent state built from earlier tokens. Packed into one stream, such a layer mixes sequences, so
every score of the model would depend on its batch-mates; this engine never serves that silently.
A layer is taken to be stateful when its class name says so (Mamba, Gated DeltaNet, short convolutions,
RWKV, recurrent blocks, lightning/linear attention ...) or it holds an `nn.Conv1d` (the causal short
convolution every such family has); a config whose `layer_types` names a stateful kind without such a
layer is refused too, since the state could not be found to keep apart.
Gated DeltaNet layers of the families in `GATED_DELTA_FAMILIES` are wrapped (`gated_delta.py`); any
other stateful layer raises `StatefulLayerError` (the loader turns it into a `ModelLoadError`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import nn

from kafka_scorer.engine.layers.parts import number
from kafka_scorer.engine.recurrent.gated_delta import PackedGatedDeltaNet, conv1d, delta_rule_of
from kafka_scorer.engine.recurrent.projections import projections_for

if TYPE_CHECKING:
    from transformers import PreTrainedModel

GATED_DELTA_FAMILIES = frozenset({"qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next"})
"""`model_type`s whose Gated DeltaNet layers `gated_delta.py` computes (checked against transformers'
own layers, one pair at a time, in tests/engine/test_hybrid_models.py)."""

STATEFUL_LAYER_TYPES = frozenset(
    {"linear_attention", "mamba", "mamba2", "conv", "hybrid", "recurrent", "rwkv"}
)
"""`layer_types` values that name a layer carrying state along the sequence (Jamba maps its Mamba
layers to "linear_attention", LFM2 calls its short convolutions "conv")."""

_STATEFUL_NAME_PARTS = (
    "mamba",
    "deltanet",
    "deltaattention",
    "shortconv",
    "recurrent",
    "rwkv",
    "lightning",
    "lstm",
    "ssm",
    "linearattention",
    "mixer",
)


class StatefulLayerError(RuntimeError):
    """The decoder has layers carrying state along the sequence that this engine cannot keep apart."""


@dataclass(frozen=True)
class RecurrentSpec:
    """What the runner needs to give a hybrid model's stateful layers their runs (`runs.py`)."""

    layers: int
    """Stateful layers wrapped."""
    window: int
    """Earlier tokens each layer's convolution sees (its kernel size - 1)."""
    state_bytes: int = 0
    """What a cached prefix keeps of all of them, whatever its length (states and windows)."""


def _is_stateful(module: nn.Module) -> bool:
    name = type(module).__name__.lower().replace("_", "")
    if any(part in name for part in _STATEFUL_NAME_PARTS):
        return True
    return any(isinstance(child, nn.Conv1d) for child in module.children())


def stateful_layers(decoder: nn.Module) -> list[tuple[str, nn.Module]]:
    """(qualified name, module) of each outermost stateful module of `decoder`."""
    found: list[tuple[str, nn.Module]] = []
    for name, module in decoder.named_modules():
        if module is decoder or any(name.startswith(outer + ".") for outer, _ in found):
            continue
        if _is_stateful(module):
            found.append((name, module))
    return found


PASSES_LAYER_KWARGS = "5.9"
"""The first transformers whose hybrid decoder layers hand their keyword arguments on to the Gated
DeltaNet layer: before it, a packed forward's runs could not reach the wrapper (5.1 to 5.8 call it with
four fixed arguments), and every sequence would share one state."""


def _check_transformers(family: object) -> None:
    import transformers
    from packaging.version import Version

    if Version(transformers.__version__) < Version(PASSES_LAYER_KWARGS):
        raise StatefulLayerError(
            f"model_type {family!r} needs transformers >= {PASSES_LAYER_KWARGS} (installed: "
            f"{transformers.__version__}): older decoder layers keep the packed sequences' boundaries from "
            f"its Gated DeltaNet layers; pip install 'transformers>={PASSES_LAYER_KWARGS}'"
        )


def prepare_recurrent(model: PreTrainedModel, config: object) -> RecurrentSpec | None:
    """Wrap `model`'s stateful layers in place, or raise `StatefulLayerError`; None: it has none."""
    decoder = _decoder(model)
    family = getattr(config, "model_type", None)
    layers = stateful_layers(decoder)
    named_types = sorted(set(getattr(config, "layer_types", None) or ()) & STATEFUL_LAYER_TYPES)
    if not layers:
        if named_types:
            raise StatefulLayerError(
                f"model_type {family!r}: its config names layers of type {named_types}, which carry state "
                "along the sequence, but no such layer was found to keep packed sequences apart"
            )
        return None
    refused = sorted({type(module).__name__ for _, module in layers if not _supported(family, module)})
    if refused:
        raise StatefulLayerError(
            f"model_type {family!r} has layers that carry state along the sequence ({', '.join(refused)}); "
            "kafka-scorer packs sequences into one stream and keeps such state apart only for the Gated "
            f"DeltaNet layers of {sorted(GATED_DELTA_FAMILIES)}, so this model's scores would depend on "
            "their batch-mates: not served"
        )
    _check_transformers(family)
    windows = {int(number(module, "conv_kernel_size")) - 1 for _, module in layers}
    if len(windows) != 1:
        raise StatefulLayerError(f"model_type {family!r}: its layers' convolution kernels differ ({windows})")
    window = windows.pop()
    state_bytes = 0
    for slot, (name, module) in enumerate(layers):
        parent, _, attribute = name.rpartition(".")
        rule = delta_rule_of(module)
        if rule is None:
            raise StatefulLayerError(f"model_type {family!r}: its modeling module has no gated delta rule")
        projections = projections_for(module)
        if projections is None:  # never: `_supported` refused layers without them above
            raise StatefulLayerError(f"model_type {family!r}: {type(module).__name__} lacks the projections")
        wrapped = PackedGatedDeltaNet(module, projections, rule, slot)
        setattr(decoder.get_submodule(parent), attribute, wrapped)
        state_bytes += _state_bytes(module, window)
    return RecurrentSpec(layers=len(layers), window=window, state_bytes=state_bytes)


def _state_bytes(module: nn.Module, window: int) -> int:
    """What a prefix keeps of one Gated DeltaNet layer: its float32 recurrent state [value heads, key
    dim, value dim] and its last `window` convolution inputs."""
    heads, key_dim, value_dim = (int(getattr(module, n)) for n in ("num_v_heads", "head_k_dim", "head_v_dim"))
    weight = conv1d(module).weight
    return 4 * heads * key_dim * value_dim + window * int(number(module, "conv_dim")) * weight.element_size()


def _decoder(model: PreTrainedModel) -> nn.Module:
    """The text decoder (a multimodal checkpoint's language model, not its vision or audio towers,
    whose convolutions are not along the text); transformers' `get_decoder` raises for a few exotic
    layouts, which are then searched whole."""
    try:
        return model.get_decoder()
    except (AttributeError, ValueError, NotImplementedError):
        return model.base_model


def _supported(family: str | None, module: nn.Module) -> bool:
    return (
        family in GATED_DELTA_FAMILIES
        and "gateddeltanet" in type(module).__name__.lower()
        and projections_for(module) is not None
        and delta_rule_of(module) is not None
    )
