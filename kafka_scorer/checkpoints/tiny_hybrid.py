"""Tiny random shapes of the hybrid decoders (Qwen3.5, Qwen3-Next): Gated DeltaNet layers beside full
attention, for the tests of `engine/recurrent/` (built by tiny_models.py like every other arch)."""

from __future__ import annotations

from typing import Any

HYBRID_ARCHS = ("qwen3_5", "qwen3_5_moe", "qwen3_next")
"""Gated DeltaNet + full-attention hybrids (`engine/recurrent/`); Qwen3.5-MoE has no classifier class."""


def hybrid_fields(arch: str, num_layers: int) -> dict[str, Any]:
    """Tiny Gated DeltaNet shapes for a hybrid arch: two key heads serving four value heads (grouped, as
    in the real checkpoints), key and value head sizes that differ, a 4-tap convolution, and layers
    alternating GDN and full attention, GDN first and last; MoE archs get 4 experts, 2 per token."""
    if arch not in HYBRID_ARCHS:
        return {}
    fields: dict[str, Any] = dict(
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        layer_types=["linear_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)],
    )
    if arch in ("qwen3_5_moe", "qwen3_next"):
        fields |= dict(
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32
        )
    return fields
