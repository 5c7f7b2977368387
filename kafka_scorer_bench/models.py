"""Random-initialised checkpoints of real model shapes, written to disk like any downloaded model.

No model hub is reachable where the benchmark runs, and speed does not depend on what the weights
are, only on their shapes. So each shape is a config, the weights are random, and the checkpoint is
written with `save_pretrained` and loaded back through `Scorer` (and, independently, through plain
transformers for the baseline) exactly as a real checkpoint would be.

Shapes follow the published configs of the Qwen3 family (hidden size, layers, heads, KV heads, head
dim, MLP width, vocabulary); `cpu-small` is the 2-core CPU shape the issue names, `tiny` is for tests.
The `qwen3.5-*` shapes are hybrids (issue 38): three Gated DeltaNet layers to one full-attention layer,
as in Qwen3.5 and Qwen3-Next, at the sizes of `tiny` and `cpu-small`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kafka_scorer.checkpoints.tiny_models import Arch, Kind

# Ids below this are never drawn as synthetic tokens: they hold the tokenizer's special tokens (pad
# among them), so a padded baseline batch can never mistake a real token for padding.
FIRST_REGULAR_ID = 16


@dataclass(frozen=True)
class LinearLayers:
    """A hybrid's Gated DeltaNet layers: one full-attention layer in `every`, the rest linear attention."""

    every: int
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    conv: int = 4

    def layer_types(self, num_layers: int) -> list[str]:
        return [
            "full_attention" if (i + 1) % self.every == 0 else "linear_attention" for i in range(num_layers)
        ]

    def params(self, hidden: int) -> int:
        """Matmul weights of one GDN layer's mixer: q, k, v, z and the b/a gates in, the output out."""
        keys, values = self.key_heads * self.key_dim, self.value_heads * self.value_dim
        return hidden * (2 * keys + 2 * values + 2 * self.value_heads) + values * hidden


@dataclass(frozen=True)
class ModelShape:
    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool
    arch: Arch = "qwen3"
    linear: LinearLayers | None = None
    """Set for a hybrid: its linear-attention layers (`arch` then names a hybrid family)."""

    def decoder_params(self) -> int:
        """Matmul weights one token passes through in the decoder stack (embedding lookup is free).
        A hybrid's full-attention layers gate their output, so their query projection is twice as wide."""
        gated = 2 if self.linear else 1
        q = gated * self.hidden_size * self.num_heads * self.head_dim
        kv = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        o = self.num_heads * self.head_dim * self.hidden_size
        mlp = 3 * self.hidden_size * self.intermediate_size
        if self.linear is None:
            return self.num_layers * (q + kv + o + mlp)
        full = self.num_layers // self.linear.every
        linear = self.num_layers - full
        return full * (q + kv + o) + linear * self.linear.params(self.hidden_size) + self.num_layers * mlp

    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size


SHAPES: dict[str, ModelShape] = {
    "tiny": ModelShape("tiny", 512, 64, 128, 2, 4, 2, 16, True),
    "cpu-small": ModelShape("cpu-small", 32768, 512, 1536, 8, 8, 4, 64, True),
    "qwen3-0.6b": ModelShape("qwen3-0.6b", 151936, 1024, 3072, 28, 16, 8, 128, True),
    "qwen3-8b": ModelShape("qwen3-8b", 151936, 4096, 12288, 36, 32, 8, 128, False),
    "qwen3.5-tiny": ModelShape(
        "qwen3.5-tiny", 512, 64, 128, 4, 4, 2, 16, True, "qwen3_5", LinearLayers(4, 2, 4, 16, 8)
    ),
    "qwen3.5-cpu-small": ModelShape(
        "qwen3.5-cpu-small", 32768, 512, 1536, 8, 8, 2, 64, True, "qwen3_5", LinearLayers(4, 4, 8, 64, 64)
    ),
}


def shape_config(
    shape: ModelShape, kind: Kind, *, num_labels: int, pad_token_id: int, bos_token_id: int | None
):
    """`shape` as the transformers config of its family (`shape.arch`: Qwen3 or a hybrid), with the
    Qwen families' published context, RoPE base and norm epsilon; a hybrid's linear-attention fields as
    transformers' Qwen3.5 config names them."""
    from kafka_scorer.checkpoints.tiny_models import decoder_config

    linear = shape.linear
    hybrid = {}
    if linear is not None:
        hybrid = dict(
            layer_types=linear.layer_types(shape.num_layers),
            linear_conv_kernel_dim=linear.conv,
            linear_key_head_dim=linear.key_dim,
            linear_value_head_dim=linear.value_dim,
            linear_num_key_heads=linear.key_heads,
            linear_num_value_heads=linear.value_heads,
        )
    return decoder_config(
        shape.arch,
        kind,
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_layers=shape.num_layers,
        num_heads=shape.num_heads,
        num_kv_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        tie_word_embeddings=shape.tie_word_embeddings,
        max_position_embeddings=40960,
        num_labels=num_labels,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        **hybrid,
    )


def build_shaped_model(
    directory: str | Path,
    shape: ModelShape | str,
    kind: Kind = "causal",
    *,
    num_labels: int = 2,
    dtype: str = "float32",
    seed: int = 0,
    init_device: str = "cpu",
    chat: bool = False,
) -> Path:
    """Write a random model of `shape` (plus a small offline tokenizer) to `directory`.

    `init_device="cuda"` initialises the weights on the GPU: random init of an 8B model on a CPU takes
    minutes, on a GPU seconds. Saved in `dtype` so loading reads no more bytes than serving needs.
    `chat`: a Qwen-style chat tokenizer (no BOS), for a prompt template's special tokens.
    """
    from kafka_scorer.checkpoints.tiny_models import build_chat_tokenizer, build_tokenizer, save_random_model

    shape = SHAPES[shape] if isinstance(shape, str) else shape
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_chat_tokenizer(path) if chat else build_tokenizer(path)
    specials = [tokenizer.pad_token_id, tokenizer.bos_token_id]
    if any(i is not None and i >= FIRST_REGULAR_ID for i in specials) or len(tokenizer) > shape.vocab_size:
        raise RuntimeError("special token ids must lie below FIRST_REGULAR_ID, all ids within the vocabulary")
    config = shape_config(
        shape,
        kind,
        num_labels=num_labels,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    return save_random_model(config, kind, path, seed=seed, dtype=dtype, init_device=init_device)
