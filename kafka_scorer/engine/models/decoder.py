"""The decoder body the runner calls for the served decoder families, in place of transformers' own.

transformers' eager layers spend most of a forward's GPU time outside the matmuls: RMSNorm, RoPE,
SiLU·mul, residual adds, casts and concatenations each a kernel of their own (about two thirds of the
CUDA time of a Qwen3-0.6B-shaped forward, matmuls about a fifth; issue 24's profile). Here the same
arithmetic runs as `engine/models/decoder_layer.py`'s two dense regions per layer over merged q/k/v and
gate/up weights; on CUDA each region is one `torch.compile` (inductor fuses the elementwise work into
the matmuls' neighbours), compiled at warm-up, before the worker is ready. On the CPU the regions run
eagerly (the same ops; the CPU's time is in the matmuls) unless asked otherwise.

The checkpoint stays loaded as transformers built it (the embedding, rotary tables and heads are its
modules; the load-time probes run its layers); only the layers' weights are shared into merged views.
A family outside `FAMILIES`, or a layer that does not have the expected parts, keeps transformers'
body, which reaches our attention through the registry as before.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from kafka_scorer.engine.attention.registry import METADATA_KWARG
from kafka_scorer.engine.layers.activation import ACTIVATIONS
from kafka_scorer.engine.layers.invariant import pad_rows, padded_length
from kafka_scorer.engine.layers.merged import merge
from kafka_scorer.engine.layers.norm import add_rms_norm
from kafka_scorer.engine.layers.parts import linear, model_config, module_list, number, submodule, tensor
from kafka_scorer.engine.layers.rotary import half_tables
from kafka_scorer.engine.models.decoder_layer import (
    LayerShape,
    LayerWeights,
    Regions,
    run_layer,
)

log = logging.getLogger(__name__)

FAMILIES = frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma2"})
"""`model_type`s whose layers are the pre-norm shape `decoder_layer.py` computes."""


class FusedDecoder(nn.Module):
    """[T] token ids + positions + the batch's attention metadata -> final-norm hidden states [T, D].

    Called like a transformers base model (`input_ids` / `position_ids` of shape [1, T] and the metadata
    kwarg; returns a one-element tuple of [1, T, D]) so the runner treats both bodies alike."""

    def __init__(
        self,
        body: nn.Module,
        shape: LayerShape,
        layers: list[LayerWeights],
        regions: Regions,
        embed_scale: float | None = None,
    ):
        super().__init__()
        self.embed = submodule(body, "embed_tokens")
        self.embed_scale = embed_scale
        self.rotary = submodule(body, "rotary_emb")
        self.final_norm = tensor(submodule(body, "norm"), "weight")
        self.shape = shape
        self.layers = layers
        self.regions = regions

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, **kwargs: object
    ) -> tuple[torch.Tensor]:
        metadata = kwargs[METADATA_KWARG]
        if self.shape.fixed_rows:  # deterministic mode: whole row blocks (`layers/invariant.py`)
            tokens = padded_length(input_ids.shape[1])
            input_ids, position_ids = (pad_rows(x[0], tokens)[None] for x in (input_ids, position_ids))
        hidden = self.embed(input_ids[0])
        if self.embed_scale is not None:  # as the model's forward scales, in the activations' dtype
            hidden = hidden * torch.tensor(self.embed_scale, dtype=hidden.dtype)
        tables = half_tables(*self.rotary(hidden[None], position_ids))
        residual: torch.Tensor | None = None
        for weights in self.layers:
            hidden, residual = run_layer(
                hidden, residual, weights, self.shape, tables, metadata, self.regions
            )
        out, _ = add_rms_norm(hidden, residual, self.final_norm, self.shape.eps, self.shape.offset_norm)
        return (out[None],)


def fused_decoder(body: nn.Module, compiled: bool) -> FusedDecoder | None:
    """The engine's body over `body`'s weights, or None (with the reason logged) where it does not apply."""
    config = model_config(body)
    family = getattr(config, "model_type", None)
    activation = ACTIVATIONS.get(
        str(getattr(config, "hidden_act", None) or getattr(config, "hidden_activation", ""))
    )
    if family not in FAMILIES or activation is None:
        log.info("model_type %r: transformers' decoder layers (no fused forward for it)", family)
        return None
    try:
        decoder_layers = module_list(body, "layers")
        layers = [_layer_weights(layer, index) for index, layer in enumerate(decoder_layers)]
        norm = submodule(decoder_layers[0], "input_layernorm")
    except AttributeError as exc:
        log.info("model_type %r: transformers' decoder layers (%s)", family, exc)
        return None
    sandwich = family == "gemma2"
    attention = submodule(decoder_layers[0], "self_attn")
    shape = LayerShape(
        heads=int(config.num_attention_heads),
        kv_heads=int(config.num_key_value_heads),
        head_dim=int(number(attention, "head_dim")),
        eps=float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))),
        offset_norm=sandwich,
        sandwich=sandwich,
        activation=activation,
    )
    regions = Regions.eager(shape)
    if compiled:
        regions = compile_regions(regions)
    return FusedDecoder(body, shape, layers, regions, _embed_scale(body, sandwich))


def _embed_scale(body: nn.Module, gemma: bool) -> float | None:
    """Gemma scales its embeddings by sqrt(hidden): newer transformers inside the embedding module
    (`embed_scale`), older ones (5.1) in the model's forward, which the fused body then does itself."""
    if not gemma or hasattr(body.embed_tokens, "embed_scale"):
        return None
    return float(model_config(body).hidden_size) ** 0.5


def compile_regions(regions: Regions) -> Regions:
    """Each region compiled once for any token count; the first forward (the warm-up's) compiles."""
    return Regions(
        torch.compile(regions.before, dynamic=True, fullgraph=True),
        torch.compile(regions.after, dynamic=True, fullgraph=True),
        compiled=True,
    )


def _layer_weights(layer: nn.Module, index: int) -> LayerWeights:
    attn, mlp = submodule(layer, "self_attn"), submodule(layer, "mlp")
    qkv, qkv_bias = merge([linear(attn, "q_proj"), linear(attn, "k_proj"), linear(attn, "v_proj")])
    gate_up, _ = merge([linear(mlp, "gate_proj"), linear(mlp, "up_proj")])
    o_proj, down_proj = linear(attn, "o_proj"), linear(mlp, "down_proj")
    if o_proj.bias is not None or down_proj.bias is not None or linear(mlp, "gate_proj").bias is not None:
        raise AttributeError("output projections with a bias")
    q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
    pre_ff, post_ff = (
        getattr(layer, "pre_feedforward_layernorm", None),
        getattr(layer, "post_feedforward_layernorm", None),
    )
    softcap = getattr(attn, "attn_logit_softcapping", None)
    return LayerWeights(
        index=int(getattr(attn, "layer_idx", index)),
        input_norm=tensor(submodule(layer, "input_layernorm"), "weight"),
        qkv=qkv,
        qkv_bias=qkv_bias,
        q_norm=q_norm.weight if q_norm is not None else None,
        k_norm=k_norm.weight if k_norm is not None else None,
        o_proj=o_proj.weight,
        post_attention_norm=tensor(submodule(layer, "post_attention_layernorm"), "weight"),
        gate_up=gate_up,
        down=down_proj.weight,
        pre_ff_norm=pre_ff.weight if pre_ff is not None else None,
        post_ff_norm=post_ff.weight if post_ff is not None else None,
        scale=float(number(attn, "scaling")),
        softcap=float(softcap) if softcap else None,
        window=getattr(attn, "sliding_window", None),
        names_window=hasattr(attn, "sliding_window"),
    )
