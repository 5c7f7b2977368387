"""Tiny random stand-ins for two pointwise decoder rerankers served through a prompt template.

mxbai-rerank-v2 is a Qwen2 CausalLM with Qwen's chat tokenizer (its labels "0" and "1" are single
digits, one token each); bge-reranker-v2-gemma is a Gemma CausalLM whose tokenizer puts a BOS first
and knows "Yes" as one token. Both are built with transformers' own config classes and written with
`save_pretrained`, so the worker loads them as it loads the real checkpoints, and the presets
(`mxbai-rerank-v2`, `bge-reranker-v2-gemma` in engine/prepare/templates.py) can be checked against
plain transformers without the real weights.
"""

from __future__ import annotations

from pathlib import Path

from kafka_scorer.checkpoints.tiny_models import (
    _CORPUS,
    build_chat_tokenizer,
    byte_level_bpe,
    save_random_model,
    tiny_config,
)

GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]
_GEMMA_CORPUS = [
    *_CORPUS,
    "A: what is the capital of China?\nB: The capital of China is Beijing.\n",
    "Given a query A and a passage B, determine whether the passage contains an answer to the query "
    "by providing a prediction of either 'Yes' or 'No'.",
    *["Yes\nNo\nYes No"] * 8,
]


def build_tiny_mxbai(directory: str | Path, *, seed: int = 0, hidden_size: int = 64) -> Path:
    """A random Qwen2 CausalLM with a Qwen-style chat tokenizer (no BOS), as mxbai-rerank-v2 ships."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_chat_tokenizer(path)
    config = tiny_config(
        "qwen2",
        "causal",
        vocab_size=len(tokenizer) + 16,
        hidden_size=hidden_size,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    return save_random_model(config, "causal", path, seed=seed)


def build_gemma_tokenizer(directory: Path, vocab_size: int = 448):
    """A byte-level BPE with Gemma's special tokens, a BOS post-processor (Gemma's tokenizer adds
    `<bos>`), and "Yes" / "No" learnt as single tokens."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    tok, trainer = byte_level_bpe("<unk>", GEMMA_SPECIALS, vocab_size)
    tok.train_from_iterator(_GEMMA_CORPUS * 4, trainer=trainer)
    bos = tok.token_to_id("<bos>")
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", bos)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )
    fast.save_pretrained(directory)
    return fast


def build_tiny_bge_gemma(directory: str | Path, *, seed: int = 0, hidden_size: int = 64) -> Path:
    """A random Gemma CausalLM (transformers' `GemmaConfig`) with the tokenizer above."""
    from transformers import GemmaConfig

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_gemma_tokenizer(path)
    config = GemmaConfig(
        vocab_size=len(tokenizer) + 16,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        max_position_embeddings=4096,
        initializer_range=0.2,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return save_random_model(config, "causal", path, seed=seed)
