"""A tiny random jina-reranker-v3 (`JinaForRanking`) checkpoint in the published layout, built offline.

A Qwen3 config naming `JinaForRanking`, one `model.safetensors` with the Qwen3 body under `model.` and
the projector's two bias-free matrices under `projector.0.weight` / `projector.2.weight`, and the
Qwen-style chat tokenizer of `tiny_models.py` with the two marker tokens added. The context defaults to
the published model's 131072 positions, so the block policy's token budget behaves as it does there.

`layer_types` and `sliding_window` give jina-reranker-v3.5's pattern: sliding-window layers beside
global ones, written the way transformers' `Qwen3Config` reads them (`layer_types` naming
`sliding_attention` / `full_attention` per layer, `sliding_window` its width, `use_sliding_window`
true, without which transformers drops the width). `V35_LAYERS` is such a pattern for a tiny body.
"""

from __future__ import annotations

from pathlib import Path

from kafka_scorer.checkpoints.tiny_models import build_chat_tokenizer

MARKERS = ("<|embed_token|>", "<|rerank_token|>")
V35_LAYERS = ("sliding_attention", "sliding_attention", "full_attention", "sliding_attention")
"""Windowed layers with a global one between them, so a windowed layer reads a global layer's output."""


def build_tiny_listwise(
    directory: str | Path,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    projector_width: int = 32,
    max_positions: int = 131072,
    layer_types: tuple[str, ...] | None = None,
    sliding_window: int | None = None,
) -> Path:
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3Model

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_chat_tokenizer(path, extra_specials=MARKERS)
    config = Qwen3Config(
        vocab_size=len(tokenizer) + 16,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        architectures=["JinaForRanking"],
        **_layer_pattern(num_layers, layer_types, sliding_window),
    )
    torch.manual_seed(seed)
    body = Qwen3Model(config).eval()
    weights = {f"model.{name}": tensor.contiguous() for name, tensor in body.state_dict().items()}
    weights["projector.0.weight"] = torch.randn(hidden_size // 2, hidden_size) / hidden_size**0.5
    weights["projector.2.weight"] = torch.randn(projector_width, hidden_size // 2) / (hidden_size // 2) ** 0.5
    config.save_pretrained(path)
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def _layer_pattern(num_layers: int, layer_types: tuple[str, ...] | None, window: int | None) -> dict:
    """The config fields of a windowed pattern (none for v3's all-global body)."""
    if layer_types is None:
        return {}
    if len(layer_types) != num_layers or window is None:
        raise ValueError(f"layer_types needs one entry per layer ({num_layers}) and a sliding_window")
    return {"layer_types": list(layer_types), "sliding_window": window, "use_sliding_window": True}
