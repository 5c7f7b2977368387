"""The bench's model shapes: the compute floor counts exactly the matmul weights a token passes through.

The floor fraction (compute floor / measured time) is only as honest as `decoder_params`; the hybrids'
Gated DeltaNet layers have other projections than attention, so the count is checked against the
`nn.Linear` weights of the decoder layers transformers itself builds from each shape's config."""

from __future__ import annotations

import pytest
import torch

from kafka_scorer_bench.models import SHAPES, shape_config


def _layer_matmul_weights(shape_name: str) -> tuple[int, list[str]]:
    import transformers

    config = shape_config(SHAPES[shape_name], "causal", num_labels=2, pad_token_id=0, bos_token_id=None)
    model = transformers.AutoModelForCausalLM.from_config(config)
    linears = [m for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear)]
    return sum(m.weight.numel() for m in linears), list(getattr(config, "layer_types", []) or [])


@pytest.mark.parametrize("name", ["tiny", "qwen3.5-tiny"])
def test_the_floor_counts_every_matmul_weight_of_the_decoder_layers(name: str) -> None:
    import transformers

    if SHAPES[name].linear is not None and not hasattr(transformers, "Qwen3_5TextConfig"):
        pytest.skip(f"transformers {transformers.__version__} has no Qwen3.5")
    weights, _ = _layer_matmul_weights(name)
    assert SHAPES[name].decoder_params() == weights


def test_a_hybrid_shape_has_three_linear_attention_layers_to_one_full_attention_layer() -> None:
    import transformers

    if not hasattr(transformers, "Qwen3_5TextConfig"):
        pytest.skip(f"transformers {transformers.__version__} has no Qwen3.5")
    _, layer_types = _layer_matmul_weights("qwen3.5-tiny")
    assert layer_types == ["linear_attention"] * 3 + ["full_attention"]
