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
PATCH_SIZE = 16
MERGE_SIZE = 2


def build_tiny_vl_reranker(
    directory: str | Path,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    max_image_tokens: int = 16,
) -> Path:
    """A random Qwen3-VL CausalLM (vision tower, deepstack merger, M-RoPE) and its processor files; the
    processor scales an image to at most `max_image_tokens` merged patches."""
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    from kafka_scorer.engine.vision.checkpoint import slow_image_processor_class

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_chat_tokenizer(path, extra_specials=tuple(VISION_SPECIAL_TOKENS))
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in VISION_SPECIAL_TOKENS}
    heads = 4
    config = Qwen3VLConfig(
        text_config={
            "vocab_size": len(tokenizer) + 16,
            "hidden_size": hidden_size,
            "intermediate_size": hidden_size * 2,
            "num_hidden_layers": num_layers,
            "num_attention_heads": heads,
            "num_key_value_heads": 2,
            "head_dim": hidden_size // heads,
            "max_position_embeddings": 4096,
            # M-RoPE: the head's rotary pairs split over (time, height, width), interleaved as Qwen3-VL's
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [2, 3, 3],
                "mrope_interleaved": True,
            },
        },
        vision_config={
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "patch_size": PATCH_SIZE,
            "spatial_merge_size": MERGE_SIZE,
            "temporal_patch_size": 2,
            "out_hidden_size": hidden_size,
            "num_position_embeddings": 64,
            "deepstack_visual_indexes": [0],
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    text_config: Any = config.text_config
    text_config.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config).eval()
    model.save_pretrained(path)
    slow_image_processor_class()(
        min_pixels=(PATCH_SIZE * MERGE_SIZE) ** 2,
        max_pixels=(PATCH_SIZE * MERGE_SIZE) ** 2 * max_image_tokens,
        patch_size=PATCH_SIZE,
        merge_size=MERGE_SIZE,
        temporal_patch_size=2,
    ).save_pretrained(path)
    return path
