"""A tiny random Qwen3-VL reranker: config, weights, tokenizer and image processor, built offline.

What `template=qwen3-vl-reranker` serves in tests and what `kafka-scorer model qwen3-vl-reranker`
writes (the real Qwen3-VL-Reranker weights are not reachable here). Built with transformers' own
config class and saved with `save_pretrained`, so the worker loads it through the path a real
checkpoint takes. The tokenizer is the chat tokenizer of `tiny_models.py` plus Qwen-VL's vision
special tokens; the image processor is transformers' slow (PIL/numpy) Qwen2-VL one, the processor
Qwen3-VL checkpoints name, with a small pixel range so test images make a handful of tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kafka_scorer.checkpoints.tiny_models import build_chat_tokenizer

VISION_SPECIAL_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
PATCH_SIZES = {"qwen3_vl": 16, "qwen2_vl": 14, "qwen2_5_vl": 14}
"""Each family's vision patch edge, as its checkpoints ship it."""
MERGE_SIZE = 2


def build_tiny_vl_reranker(
    directory: str | Path,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    max_image_tokens: int = 16,
    family: str = "qwen3_vl",
) -> Path:
    """A random Qwen3-VL (or, with `family`, Qwen2-VL or Qwen2.5-VL) CausalLM — vision tower, merger,
    M-RoPE, and Qwen3-VL's deepstack features — and its processor files; the processor scales an image
    to at most `max_image_tokens` merged patches."""
    import torch
    import transformers

    from kafka_scorer.engine.vision.checkpoint import FAMILIES, slow_image_processor_class

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_chat_tokenizer(path, extra_specials=tuple(VISION_SPECIAL_TOKENS))
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in VISION_SPECIAL_TOKENS}
    patch = PATCH_SIZES[family]
    config_class = getattr(transformers, FAMILIES[family].replace("ForConditionalGeneration", "Config"))
    config = config_class(
        text_config=_text_config(family, len(tokenizer) + 16, hidden_size, num_layers),
        vision_config=_vision_config(family, hidden_size, patch),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    text_config: Any = config.text_config
    text_config.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(seed)
    model = getattr(transformers, FAMILIES[family])(config).eval()
    model.save_pretrained(path)
    slow_image_processor_class()(
        min_pixels=(patch * MERGE_SIZE) ** 2,
        max_pixels=(patch * MERGE_SIZE) ** 2 * max_image_tokens,
        patch_size=patch,
        merge_size=MERGE_SIZE,
        temporal_patch_size=2,
    ).save_pretrained(path)
    return path


def _text_config(family: str, vocab_size: int, hidden_size: int, num_layers: int) -> dict[str, Any]:
    heads = 4
    # M-RoPE: the head's rotary pairs split over (time, height, width); Qwen3-VL interleaves them
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}
    if family == "qwen3_vl":
        rope["mrope_interleaved"] = True
    return {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": hidden_size * 2,
        "num_hidden_layers": num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": 2,
        "head_dim": hidden_size // heads,
        "max_position_embeddings": 4096,
        "rope_parameters": rope,
    }


def _vision_config(family: str, hidden_size: int, patch: int) -> dict[str, Any]:
    shared = {"depth": 2, "num_heads": 2, "patch_size": patch, "spatial_merge_size": MERGE_SIZE}
    if family == "qwen2_5_vl":  # a windowed tower: attention within 2x2-token windows but in layer 1
        return {
            **shared,
            "hidden_size": 32,
            "intermediate_size": 64,
            "out_hidden_size": hidden_size,
            "window_size": patch * MERGE_SIZE * 2,
            "fullatt_block_indexes": [1],
            "temporal_patch_size": 2,
        }
    if family == "qwen2_vl":  # `hidden_size` is the merger's output (the decoder's width) there
        return {
            **shared,
            "embed_dim": 32,
            "mlp_ratio": 2,
            "hidden_size": hidden_size,
            "temporal_patch_size": 2,
        }
    return {
        **shared,
        "hidden_size": 32,
        "intermediate_size": 64,
        "temporal_patch_size": 2,
        "out_hidden_size": hidden_size,
        "num_position_embeddings": 64,
        "deepstack_visual_indexes": [0],
    }
